"""Every core: large reads run in this process and a pool of worker processes (issue 33 item 2).

:func:`ordered_map` runs a function over items — the key-group ranges of a full scan,
``read_operator``, ``export``, ``stats`` or ``diff``, cut by :func:`statequery.scan.run_tasks` —
in ``workers`` processes and yields their ``(state name, batch)`` pairs **in item order**
(key-group order): the same tables as the in-process path, cut into other batches.

``workers`` counts the calling process: ``workers=2`` is this process and one pool worker.
Items are claimed in order (:class:`_Schedule`): this process streams the items it claims as it
computes them (nothing waits in its memory, and it works while the pool starts); a worker,
when idle, claims the next item but the ones this process will get through meanwhile (measured
as they go), so each finds the other's items done when it gets there. A worker writes its
batches as Arrow IPC into a **result slot**: a file in shared memory (``/dev/shm``) it keeps
mapped, which this process maps and reads in place (no copy, no unpickling); the slot is
reused once every batch read from it is gone (:class:`_Lease`), so writing is a ``memcpy``
into pages that are already there. ``workers=1`` is the in-process path; so is any read too
small to pay for a pool (a lookup, a key, fewer than :data:`MIN_PARALLEL_BYTES` of state files).

The number of workers: the ``workers=`` option, else ``$STATEQUERY_WORKERS``, else every core
this process may run on. The pool is started once per process, with the ``forkserver`` method
where there is one (``spawn`` elsewhere; never a plain ``fork`` of a process whose threads may
hold locks); a worker imports statequery itself, while this process already reads. Scan
tasks are frozen dataclasses of plain data and handles (what Spark ships to its executors); the
savepoint's :class:`~statequery.io.FileIO` pickles without its open files. An error in a worker
is raised again in the caller as the same typed error with the same message.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

from statequery.exceptions import InvalidOptionError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MAX_PIECE_BYTES",
    "MIN_PARALLEL_BYTES",
    "WORKERS_ENV",
    "default_workers",
    "ordered_map",
    "resolve_workers",
    "shutdown",
    "start",
]

#: the environment variable that sets the number of worker processes (default: every core)
WORKERS_ENV = "STATEQUERY_WORKERS"

#: a read of fewer bytes of state files than this stays in the calling process
MIN_PARALLEL_BYTES = 8 << 20

#: key-group ranges per worker a large read is cut into (the finer, the better the calling process
#: and the workers balance; a piece costs ~nothing more since local files are read with pread)
PIECES_PER_WORKER = 16

#: the most bytes of state files in one piece: a piece's batches wait in a result slot of shared
#: memory until the caller reads them, so this bounds the slots (about this size each, a few of
#: them per worker) whatever the savepoint's size
MAX_PIECE_BYTES = 32 << 20


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


#: set in a worker process: what it reads stays in it (no pool inside a pool)
_in_worker = False


def resolve_workers(workers: int | None = None) -> int:
    """``workers`` (≥ 1), else ``$STATEQUERY_WORKERS``, else :func:`default_workers`; 1 inside
    a worker."""
    source = "workers"
    if _in_worker and (workers is None or isinstance(workers, int) and workers >= 1):
        return 1
    if workers is None:
        env = os.environ.get(WORKERS_ENV, "").strip()
        if not env:
            return default_workers()
        source = f"${WORKERS_ENV}"
        try:
            workers = int(env)
        except ValueError:
            raise InvalidOptionError(
                f"{source} must be a positive integer, got {env!r}"
            ) from None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidOptionError(f"{source} must be a positive integer, got {workers!r}")
    return workers


# -- the pool ------------------------------------------------------------------------------------

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_pool_size = 0
#: the pool whose workers have all started and imported statequery (see _Schedule.feed)
_ready_pool: ProcessPoolExecutor | None = None


def _warm_up(modules: tuple[str, ...]) -> int:
    """In a worker, before its first item: pyarrow and ``modules`` (the module of the function
    the items run) imported, so that the first item claimed is computed at once."""
    import importlib

    import pyarrow  # noqa: F401

    _keep_memory()
    for name in modules:
        importlib.import_module(name)
    return os.getpid()


#: glibc ``mallopt`` parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_kept = False


def _keep_memory() -> None:
    """In a worker (glibc only): keep freed memory for the next piece. A worker builds a piece's
    buffers and frees them all at its end; glibc's defaults hand large blocks back to the
    kernel (``munmap``, heap trimming) and the next piece faults every page in again, a
    third of a piece's CPU on a virtual machine where a page fault is dear (10M keys: 7.2
    CPU-s for the pieces one after the other in one process, 5.6 with this). The mmap
    threshold fixed at glibc's maximum (32 MiB) and trimming above 256 MiB free: a worker's
    resident memory stays at what one piece needs. The calling process is left as it is."""
    global _kept
    if _kept:
        return
    _kept = True
    import platform

    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 256 << 20)
    except (OSError, AttributeError):
        pass


def _module_of(fn: Callable[..., Any]) -> tuple[str, ...]:
    inner = getattr(fn, "func", fn)  # a functools.partial
    name = getattr(inner, "__module__", None)
    return (name,) if isinstance(name, str) and name != "__main__" else ()


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        return ctx
    return multiprocessing.get_context("spawn")


def _get_pool(workers: int) -> ProcessPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is not None and _pool_size != workers:
            _pool.shutdown(wait=True, cancel_futures=True)
            _pool = None
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=workers, mp_context=_context())
            _pool_size = workers
        return _pool


@contextmanager
def _main_hidden() -> Iterator[None]:
    """While worker processes start: ``__main__`` without a file. A ``spawn`` or ``forkserver``
    child runs the parent's main script again (only ``if __name__ == "__main__"`` stops it), and
    a library cannot ask every script that reads a savepoint for that guard; the workers need
    nothing from ``__main__``. (Processes start inside ``submit``; the pool replaces none.)"""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


#: what a worker runs: one item's ``(state name, batch)`` pairs
Pairs = Callable[[Any], Iterable[tuple[str, "pa.RecordBatch"]]]


def start(workers: int | None = None, modules: tuple[str, ...] = ("statequery.scan",)) -> None:
    """Start the pool for ``workers`` (as :func:`resolve_workers`; the calling process is one of
    them) and wait until every worker has imported pyarrow and ``modules``, so that the next
    large read gives them pieces from its first moment (a read starts the pool itself otherwise
    and reads alone meanwhile). Nothing to start for one worker."""
    global _ready_pool
    n = resolve_workers(workers)
    if n <= 1:
        return
    pool = _get_pool(n - 1)
    if _ready_pool is pool:
        return
    with _main_hidden():
        futures = [pool.submit(_warm_up, modules) for _ in range(n - 1)]
    for f in futures:
        f.result()
    with _lock:
        if _pool is pool:
            _ready_pool = pool


def shutdown() -> None:
    """Stop this process's worker pool (started again by the next parallel read) and remove its
    result slots (batches read from them stay readable: their mappings outlive the files)."""
    global _pool, _slots, _ready_pool
    with _lock:
        pool, _pool = _pool, None
        slots, _slots = _slots, None
        _ready_pool = None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
    if slots is not None:
        slots.remove()


atexit.register(shutdown)


class _WorkerError(Exception):
    """A typed error of a worker, carried to the caller (typed errors do not all pickle through
    their constructors): its class, message and attributes."""

    def __init__(self, cls: type[BaseException], message: str, attrs: dict[str, Any]) -> None:
        super().__init__(cls, message, attrs)

    def rebuild(self) -> BaseException:
        cls, message, attrs = self.args
        err: BaseException = cls.__new__(cls)
        Exception.__init__(err, message)
        err.__dict__.update(attrs)
        return err


def _spool_dir() -> str:
    """Where workers leave their results: shared memory when there is some, else the temporary
    directory."""
    import tempfile

    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


#: the name of a slot file: ``statequery-<pid of the reading process>-<n>.slot``
_SLOT_PREFIX = "statequery-"
_SLOT_SUFFIX = ".slot"

#: a slot's first size; it grows (doubling) to the largest result written into it
_SLOT_MIN_BYTES = 16 << 20

#: a worker's result: its slot, the slot file's size, and per batch (in the order of the
#: item's pairs) the state name and where the batch's Arrow IPC stream lies in the slot
_Result = tuple[str, int, list[tuple[str, int, int]]]


class _Slots:
    """The reading process's result slots: files in shared memory that workers write their
    batches into through a mapping and this process maps to read them, with no copy. A slot
    is reused (its pages already there: writing into it is a ``memcpy``, not a page fault per
    4 KB and a system call per buffer) once every batch read from it is gone: each batch holds
    a :class:`_Lease` of its slot. The files are removed when the pool stops, and files left by
    a process that died are removed by the next one."""

    def __init__(self) -> None:
        from collections import deque

        self.spool = _spool_dir()
        self.free: deque[str] = deque()
        self.count = 0
        self.maps: dict[str, Any] = {}  # path -> pa.Buffer over this process's mapping
        self._remove_orphans()

    def take(self) -> str:
        try:
            return self.free.popleft()
        except IndexError:
            self.count += 1
            return os.path.join(self.spool,
                                f"{_SLOT_PREFIX}{os.getpid()}-{self.count}{_SLOT_SUFFIX}")

    def release(self, path: str) -> None:
        self.free.append(path)

    def region(self, path: str, size: int) -> Any:
        """This process's mapping of ``path`` (a ``pa.Buffer``), at least ``size`` bytes."""
        import mmap

        import pyarrow as pa

        buf = self.maps.get(path)
        if buf is None or buf.size < size:
            with open(path, "r+b") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if len(m) < size:
                raise OSError(f"{path}: a worker's result slot is {len(m)} bytes, "
                              f"expected {size}")
            buf = self.maps[path] = pa.py_buffer(m)
        return buf

    def remove(self) -> None:
        for i in range(1, self.count + 1):
            _unlink(os.path.join(self.spool,
                                 f"{_SLOT_PREFIX}{os.getpid()}-{i}{_SLOT_SUFFIX}"))
        self.maps.clear()
        self.free.clear()

    def _remove_orphans(self) -> None:
        try:
            names = os.listdir(self.spool)
        except OSError:
            return
        for name in names:
            if not (name.startswith(_SLOT_PREFIX) and name.endswith(_SLOT_SUFFIX)):
                continue
            pid = name[len(_SLOT_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                _unlink(os.path.join(self.spool, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class _Lease:
    """Held by every batch read from a slot (the base of their buffers): the slot goes back
    to the free ones when the last of them is gone."""

    __slots__ = ("buf", "path", "slots")

    def __init__(self, slots: _Slots, path: str, buf: Any) -> None:
        self.slots, self.path, self.buf = slots, path, buf

    def __del__(self) -> None:
        self.slots.release(self.path)


_slots: _Slots | None = None


def _get_slots() -> _Slots:
    global _slots
    with _lock:
        if _slots is None:
            _slots = _Slots()
        return _slots


class _SlotSink:
    """In a worker: a file-like object writing into a slot through this process's mapping
    (kept across items: a slot reused costs no page faults), growing the file as needed."""

    #: this worker's mappings: slot path -> (file descriptor, mmap)
    maps: dict[str, tuple[int, Any]] = {}

    closed = False

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        got = self.maps.get(path)
        if got is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            if os.fstat(fd).st_size < _SLOT_MIN_BYTES:
                os.ftruncate(fd, _SLOT_MIN_BYTES)
            got = self.maps[path] = (fd, self._map(fd))
        self.fd, self.mm = got

    @staticmethod
    def _map(fd: int) -> Any:
        import mmap

        return mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        end = self.pos + n
        if end > len(self.mm):
            size = len(self.mm)
            while size < end:
                size *= 2
            os.ftruncate(self.fd, size)
            self.mm.close()
            self.mm = self._map(self.fd)
            self.maps[self.path] = (self.fd, self.mm)
        self.mm[self.pos:end] = view
        self.pos = end
        return n

    def tell(self) -> int:
        return self.pos

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _run_piece(fn: Pairs, item: Any, slot: str, pure: str | None) -> _Result:
    """In a worker: ``fn(item)``'s batches, each written as an Arrow IPC stream into the result
    slot ``slot`` (pickling the batches back costs the caller as much CPU as decoding them did;
    the caller maps the slot). ``pure``: the caller's ``$STATEQUERY_PURE_PYTHON`` (the decode
    path it asked for)."""
    import pyarrow as pa

    from statequery.backends.fastpath import PURE_ENV
    from statequery.exceptions import StatequeryError

    global _in_worker
    _in_worker = True
    _keep_memory()
    if pure is None:
        os.environ.pop(PURE_ENV, None)
    else:
        os.environ[PURE_ENV] = pure

    sink = _SlotSink(slot)
    out = pa.PythonFile(sink, mode="w")
    parts: list[tuple[str, int, int]] = []
    try:
        for name, batch in fn(item):
            start = sink.pos
            with pa.ipc.new_stream(out, batch.schema) as writer:
                writer.write_batch(batch)
            parts.append((name, start, sink.pos - start))
    except StatequeryError as e:
        raise _WorkerError(type(e), str(e), dict(e.__dict__)) from None
    return slot, len(sink.mm), parts


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _release_unless_read(slots: _Slots, slot: str, future: Future[_Result]) -> None:
    """A worker's slot comes back when its item failed or was cancelled (a result read hands
    the slot to its batches' lease; an unread one to :func:`_unread`)."""
    if future.cancelled() or future.exception() is not None:
        slots.release(slot)


def _unread(future: Future[_Result]) -> None:
    """A result nobody will read (the caller stopped early): its slot is free again."""
    if not future.cancelled() and future.exception() is None:
        slot = future.result()[0]
        if _slots is not None:
            _slots.release(slot)


def _read_result(result: _Result, slots: _Slots) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batches of a worker's result, read in place from its slot (each holds the slot's
    lease: the slot is reused once they are all gone)."""
    import pyarrow as pa

    path, size, parts = result
    try:
        whole = slots.region(path, size)
    except BaseException:
        slots.release(path)
        raise
    region = pa.foreign_buffer(whole.address, size, base=_Lease(slots, path, whole))
    del whole
    for name, offset, length in parts:
        reader = pa.ipc.open_stream(pa.BufferReader(region.slice(offset, length)))
        for batch in reader:
            yield name, batch


class _Schedule:
    """Who computes which item of one :func:`ordered_map`. The calling process streams the
    lowest item nobody claimed once it has yielded every item before it; a pool worker that
    is idle claims the lowest unclaimed item but one (that one is left for the caller, so the
    two alternate and the caller finds a worker's item finished when it gets there), never
    more than ``ahead`` items past the one the caller yields next. A worker is given its next
    item as soon as it finishes one (from the pool's result thread)."""

    def __init__(self, pool: ProcessPoolExecutor, size: int, fn: Pairs, items: list[Any],
                 ahead: int) -> None:
        self.pool, self.size, self.fn, self.items, self.ahead = pool, size, fn, items, ahead
        self.lock = threading.Lock()
        self.slots = _get_slots()
        self.pure = _pure_env()
        self.claimed = [False] * len(items)
        self.low = 0  # no item below this one is unclaimed
        self.pos = 0  # the item the caller yields next
        self.inflight = 0
        #: the pool's items; an Event until its future is known (submitted outside the lock)
        self.futures: dict[int, Future[_Result] | threading.Event] = {}
        self.closed = False
        self.warming = False
        self.warmed = 0
        #: seconds (moving averages): an item computed here, one of a worker's taken in here,
        #: an item in a worker; the fraction of an item the workers' claims lag their share
        self.t_here: float | None = None
        self.t_taken = 0.0
        self.t_pool: float | None = None
        self.credit = 0.0
        self.started: dict[int, float] = {}

    def _lowest(self, skip: int) -> int | None:
        """The lowest unclaimed item after ``skip`` unclaimed ones (None: none left)."""
        while self.low < len(self.items) and self.claimed[self.low]:
            self.low += 1
        i = self.low
        while i < len(self.items):
            if not self.claimed[i]:
                if skip == 0:
                    return i
                skip -= 1
            i += 1
        return None

    def _skip(self) -> int:
        """How many unclaimed items a worker leaves to the caller (lock held): as many as the
        caller gets through while a worker computes one (at first one), so that both finish
        their shares together and the caller finds a worker's item done when it gets there."""
        if self.t_here is None or self.t_pool is None:
            return 1
        share = max(0.0, self.t_pool - self.t_taken) / max(self.t_here, 1e-6)
        share = min(share + self.credit, float(self.ahead))
        skip = int(share)
        self.credit = share - skip
        return skip

    def timed(self, kind: str, seconds: float) -> None:
        """A duration the caller measured: ``here`` (one of its items) or ``taken`` (taking
        in one of a worker's)."""
        with self.lock:
            if kind == "here":
                self.t_here = seconds if self.t_here is None else (self.t_here + seconds) / 2
            else:
                self.t_taken = (self.t_taken + seconds) / 2

    def step(self) -> tuple[str, int, Future[_Result] | None]:
        """The caller's next move, decided under the lock: ``("pool", pos, future)`` (the item it
        yields next is a worker's) or ``("here", pos, None)`` (it is the caller's: claimed now,
        computed here and streamed)."""
        while True:
            with self.lock:
                pos = self.pos
                f = self.futures.get(pos)
                if f is None:
                    self.claimed[pos] = True
                    return "here", pos, None
                if isinstance(f, Future):
                    return "pool", pos, f
                event = f
            event.wait()

    def advance(self) -> None:
        with self.lock:
            self.futures.pop(self.pos, None)
            self.pos += 1

    def feed(self, first: bool = False) -> None:
        """Give idle workers their next items. ``first``: in the calling thread, where worker
        processes may start (with ``__main__`` hidden); from the result thread only once every
        worker process runs (a submission there starts none)."""
        if _ready_pool is not self.pool:
            # the workers are not started yet: they start and import statequery first (the
            # caller reads meanwhile); items go to them once they can compute one at once
            if first and not self.warming:
                self._warm_up()
            return
        if not first and len(getattr(self.pool, "_processes", None) or ()) < self.size:
            return
        while True:
            with self.lock:
                if self.closed or self.inflight >= self.size:
                    return
                index = self._lowest(self._skip())
                if index is None or index - self.pos > self.ahead:
                    return
                self.claimed[index] = True
                self.inflight += 1
                self.started[index] = time.perf_counter()
                slot = self.slots.take()
                event = self.futures[index] = threading.Event()
            try:
                with _main_hidden() if first else nullcontext():
                    future = self.pool.submit(_run_piece, self.fn, self.items[index], slot,
                                              self.pure)
            except BaseException:
                # the pool cannot take it (broken, shut down): the item is nobody's again (the
                # caller computes it) and no more go to the pool
                with self.lock:
                    self.inflight -= 1
                    self.closed = True
                    del self.futures[index]
                    self.claimed[index] = False
                    self.low = min(self.low, index)
                self.slots.release(slot)
                event.set()
                if first:
                    raise
                return
            future.add_done_callback(partial(_release_unless_read, self.slots, slot))
            with self.lock:
                self.futures[index] = future
            event.set()
            future.add_done_callback(partial(self._done, index))

    def _warm_up(self) -> None:
        with self.lock:
            self.warming = True
            self.inflight += self.size
        for _ in range(self.size):
            with _main_hidden():
                future = self.pool.submit(_warm_up, _module_of(self.fn))
            future.add_done_callback(self._warmed)

    def _warmed(self, future: Future[int]) -> None:
        global _ready_pool
        with self.lock:
            self.inflight -= 1
            if future.cancelled() or future.exception() is not None:
                self.closed = True  # no worker to give items to: the caller reads them all
                return
            self.warmed += 1
            if self.warmed < self.size:
                return
        with _lock:
            if _pool is self.pool:
                _ready_pool = self.pool
        self.feed()

    def _done(self, index: int, future: Future[_Result]) -> None:
        now = time.perf_counter()
        with self.lock:
            self.inflight -= 1
            began = self.started.pop(index, None)
            if began is not None:
                took = now - began
                self.t_pool = took if self.t_pool is None else (self.t_pool + took) / 2
        if not future.cancelled() and future.exception() is None:
            self.feed()

    def close(self) -> None:
        """The caller stopped (or finished): no more submissions; results nobody reads go."""
        with self.lock:
            self.closed = True
            futures = [f for f in self.futures.values() if isinstance(f, Future)]
            self.futures = {}
        for f in futures:
            if not f.cancel():
                f.add_done_callback(_unread)


def _pure_env() -> str | None:
    from statequery.backends.fastpath import PURE_ENV

    return os.environ.get(PURE_ENV)


def ordered_map(
    fn: Pairs, items: Iterable[Any], workers: int, local: Pairs | None = None
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """``fn(item)``'s ``(state name, batch)`` pairs for every item, in item order, computed by
    ``workers`` processes: this one (``local(item)``, default ``fn``) and ``workers - 1`` pool
    workers (see :class:`_Schedule`): this process streams its items as it computes them, a
    worker's come back through shared memory; nothing waits in this process's memory. At
    most two items per worker past the one yielded next are claimed. ``fn`` and the items
    must pickle (a module-level function, frozen dataclasses)."""
    todo = list(items)
    run_here = local or fn
    if workers <= 1 or len(todo) <= 1:
        for item in todo:
            yield from run_here(item)
        return
    sched = _Schedule(_get_pool(workers - 1), workers - 1, fn, todo, 2 * workers)
    try:
        sched.feed(first=True)
        while sched.pos < len(todo):
            move, index, future = sched.step()
            if move == "pool":
                assert future is not None
                try:
                    result = future.result()
                except _WorkerError as e:
                    raise e.rebuild() from None
                sched.advance()
                sched.feed(first=True)
                began = time.perf_counter()
                yield from _read_result(result, sched.slots)
                sched.timed("taken", time.perf_counter() - began)
            else:  # the caller's own item, streamed
                began = time.perf_counter()
                for pair in run_here(todo[index]):
                    yield pair
                    sched.feed(first=True)
                sched.timed("here", time.perf_counter() - began)
                sched.advance()
                sched.feed(first=True)
    finally:
        sched.close()
