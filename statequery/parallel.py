"""Every core: large reads run in this process and a pool of worker processes (issue 33 item 2).

:func:`ordered_map` runs a function over items — the key-group ranges of a full scan,
``read_operator``, ``export``, ``stats`` or ``diff``, cut by :func:`statequery.scan.run_tasks` —
in ``workers`` processes and yields their ``(state name, batch)`` pairs **in item order**
(key-group order): the same tables as the in-process path, cut into other batches.

``workers`` counts the calling process: ``workers=2`` is this process and one pool worker.
Items are claimed in order (:class:`_Schedule`): this process streams the items it claims as it
computes them (nothing waits in its memory, and it works while the pool starts); a worker,
when idle, claims the next item but the ones this process will get through meanwhile (measured
as they go), so each finds the other's items done when it gets there. A worker's batches go
into a **result slot**: a file in shared memory (``/dev/shm``) it keeps mapped, which this
process maps; the compiled decoders build the batches' buffers straight into it (the copy they
make into a new bytes object otherwise: ``_read.arena_set``), the worker sends where each
buffer lies (the layout of the Arrow C data interface) and this process rebuilds the batches
over its mapping: no copy, no serialisation, no unpickling (a buffer built elsewhere is copied
in; a dictionary or extension type travels as Arrow IPC). The slot is reused once every batch
read from it is gone (:class:`_Lease`), so its pages are already there (allocated up front: a
full ``/dev/shm`` is an error the worker reports, and the caller computes that item, never a
``SIGBUS``); a worker that finds a buffer it built into a slot still alive after its item (a
cache keeping it) never has that slot reused and builds no more buffers in slots. A worker
that dies, a pool shut down during a read, a slot that cannot be mapped: the caller computes
those items itself, so a read gives the same rows whatever happens to the pool. ``workers=1`` is the
in-process path; so is any read too small to pay for a pool (a lookup, a key, fewer than
:data:`MIN_PARALLEL_BYTES` of state files).

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
from concurrent.futures import BrokenExecutor, CancelledError, Future, ProcessPoolExecutor
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

#: items a pool worker is given ahead: the next one waits in its queue while it computes one,
#: so it never idles while its result goes back and this process hands it another (the
#: pool's result thread needs the GIL, which this process's decoding holds most of the time)
QUEUED_PER_WORKER = 2

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


def _warm_up(modules: tuple[str, ...], fault_in: bool = True) -> int:
    """In a worker, before its first item: pyarrow and ``modules`` (the module of the function
    the items run) imported, so that the first item claimed is computed at once; ``fault_in``:
    and a piece's heap faulted in (:func:`_keep_memory`): when the pool starts ahead of the
    reads; a read that starts the pool waits for no fault-in (its first piece faults in what
    it takes, once)."""
    import importlib

    import pyarrow  # noqa: F401

    _keep_memory(fault_in)
    for name in modules:
        module = importlib.import_module(name)
        warm = getattr(module, "warm_worker", None)
        if callable(warm):
            warm()
    return os.getpid()


#: heap a worker faults in before its first item: what one piece's buffers take (a piece of
#: :data:`MAX_PIECE_BYTES` of state files and its Arrow buffers)
_HEAP_BYTES = 4 * MAX_PIECE_BYTES


def _fault_in_heap() -> None:
    """In a worker, once glibc keeps freed memory (:func:`_keep_memory`): grow the heap to what
    a piece needs and free it; glibc keeps it (trim threshold), so the first piece does not
    fault in every page it allocates (10M keys: the first piece took 0.23 s against 0.08 s for
    the next)."""
    chunk = MAX_PIECE_BYTES - (1 << 20)  # under the mmap threshold: from the heap
    blocks = [bytearray(chunk) for _ in range(_HEAP_BYTES // chunk)]
    del blocks


#: glibc ``mallopt`` parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_kept = False


def _keep_memory(fault_in: bool = True) -> None:
    """In a worker (glibc only): keep freed memory for the next piece. A worker builds a piece's
    buffers and frees them all at its end; glibc's defaults hand large blocks back to the
    kernel (``munmap``, heap trimming) and the next piece faults every page in again, a
    third of a piece's CPU on a virtual machine where a page fault is dear (10M keys: 7.2
    CPU-s for the pieces one after the other in one process, 5.6 with this). The mmap
    threshold fixed at glibc's maximum (32 MiB) and trimming above 256 MiB free: a worker's
    resident memory stays at what one piece needs, and that is faulted in now
    (:func:`_fault_in_heap`) when ``fault_in``. The calling process is left as it is."""
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
        kept = bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, 256 << 20))
    except (OSError, AttributeError):
        return
    if kept and fault_in:
        _fault_in_heap()


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


#: reads using the pool now (a pool in use is never resized under them)
_active = 0


def _get_pool(workers: int) -> tuple[ProcessPoolExecutor, int]:
    """The pool and its size: ``workers`` processes, or the pool in use by another read of this
    process whatever its size (a nested read never stops an outer read's pool). A broken pool
    (a worker died) is replaced. The pool replaced is shut down outside the lock (its result
    thread may be waiting for it)."""
    global _pool, _pool_size, _ready_pool
    old = None
    with _lock:
        broken = _pool is not None and bool(getattr(_pool, "_broken", False))
        if _pool is not None and (broken or (_pool_size != workers and _active == 0)):
            old, _pool, _ready_pool = _pool, None, None
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=workers, mp_context=_context())
            _pool_size = workers
        pool, size = _pool, _pool_size
    if old is not None:
        old.shutdown(wait=True, cancel_futures=True)
    return pool, size


@contextmanager
def _using_pool() -> Iterator[None]:
    global _active
    with _lock:
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1


@contextmanager
def _main_hidden() -> Iterator[None]:
    """While worker processes start: ``__main__`` without a file. A ``spawn`` or ``forkserver``
    child runs the parent's main script again (only ``if __name__ == "__main__"`` stops it), and
    a library cannot ask every script that reads a savepoint for that guard; the workers need
    nothing from ``__main__``. (Processes start inside ``submit``; the pool replaces none.)"""
    global _hidden_depth, _hidden_main
    with _hidden_lock:
        if _hidden_depth == 0:
            _hidden_main = sys.modules.get("__main__")
            sys.modules["__main__"] = types.ModuleType("__main__")
        _hidden_depth += 1
    try:
        yield
    finally:
        with _hidden_lock:
            _hidden_depth -= 1
            if _hidden_depth == 0 and _hidden_main is not None:
                sys.modules["__main__"] = _hidden_main
                _hidden_main = None


#: nested or concurrent ``_main_hidden`` (threads): the real ``__main__`` is put back by the last
_hidden_lock = threading.RLock()
_hidden_depth = 0
_hidden_main: types.ModuleType | None = None


def _may_start_processes(pool: ProcessPoolExecutor, size: int) -> bool:
    """Whether a submission may start a worker process (then ``__main__`` is hidden)."""
    return len(getattr(pool, "_processes", None) or ()) < size


#: what a worker runs: one item's ``(state name, batch)`` pairs
Pairs = Callable[[Any], Iterable[tuple[str, "pa.RecordBatch"]]]


def start(workers: int | None = None, modules: tuple[str, ...] = ("statequery.scan",),
          wait: bool = True) -> None:
    """Start the pool for ``workers`` (as :func:`resolve_workers`; the calling process is one of
    them) and wait until every worker has imported pyarrow and ``modules``, so that the next
    large read gives them pieces from its first moment (a read starts the pool itself otherwise
    and reads alone meanwhile). Nothing to start for one worker. ``wait=False``: return at once
    (the workers start while this process goes on: the CLI starts them before it imports and
    opens what it reads)."""
    n = resolve_workers(workers)
    if n <= 1:
        return
    pool, size = _get_pool(n - 1)
    if _ready_pool is pool:
        return
    # a pool waited for faults its workers' heap in now (the reads come later); one started
    # without waiting (the CLI, reading at once) does not delay its workers' first pieces
    futures = _submit_warm_ups(pool, size, modules, fault_in=wait)
    if wait:
        for f in futures:
            f.result()
        _mark_ready(pool)
        return

    def warmed(_: Future[int]) -> None:
        # every warm-up done and none failed (else a read gives this pool no pieces before its
        # own warm-up); two last ones both seeing it mark the pool ready twice, which is harmless
        if all(f.done() and not f.cancelled() and f.exception() is None for f in futures):
            _mark_ready(pool)

    for f in futures:
        f.add_done_callback(warmed)


def _submit_warm_ups(
    pool: ProcessPoolExecutor, size: int, modules: tuple[str, ...], fault_in: bool
) -> list[Future[int]]:
    """One :func:`_warm_up` per worker (processes may start: ``__main__`` hidden)."""
    with _main_hidden():
        return [pool.submit(_warm_up, modules, fault_in) for _ in range(size)]


def _mark_ready(pool: ProcessPoolExecutor) -> None:
    """Every worker of ``pool`` has warmed up: reads give it pieces from their start (unless
    the pool was replaced meanwhile)."""
    global _ready_pool
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


def _forget_in_child() -> None:
    """In a child forked from a reading process (``os.fork``, multiprocessing's ``fork``): the
    parent's pool and slots are not the child's (its exit must not stop or remove them)."""
    global _pool, _slots, _ready_pool, _active, _lock
    _pool = None
    _slots = None
    _ready_pool = None
    _active = 0
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


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


#: shared memory with less free than this is passed over for the temporary directory (a
#: container's /dev/shm is often 64 MiB)
MIN_SHM_FREE = 1 << 30


def _spool_dir() -> str:
    """Where workers leave their results: shared memory when there is enough free, else the
    temporary directory (slots are mapped files either way)."""
    import tempfile

    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
        if os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize >= MIN_SHM_FREE:
            return shm
    except OSError:
        pass
    return tempfile.gettempdir()


class _SlotFull(Exception):
    """A slot could not grow: no room left where the slots are (the caller computes the item)."""


#: the name of a slot file: ``statequery-<pid of the reading process>-<n>.slot``
_SLOT_PREFIX = "statequery-"
_SLOT_SUFFIX = ".slot"

#: a slot's first size; it grows (doubling) to the largest result written into it
_SLOT_MIN_BYTES = 16 << 20

#: a worker's result: its slot, the slot file's size, and per batch (in the order of the
#: item's pairs) the state name and where the batch's Arrow IPC stream lies in the slot
_Result = tuple[str, int, list["_Part"], bool, float]


class _Slots:
    """The reading process's result slots: files in shared memory that workers write their
    batches into through a mapping and this process maps to read them, with no copy. A slot
    is reused (its pages already there: writing into it is a ``memcpy``, not a page fault per
    4 KB and a system call per buffer) once every batch read from it is gone: each batch holds
    a :class:`_Lease` of its slot.

    Names: ``statequery-<pid>-<token>-<n>.slot``, the token random per instance (a new instance
    after :func:`shutdown` never reuses a name an older batch may still map). The instance holds
    an ``flock`` on ``statequery-<pid>-<token>.lock`` while it lives: files whose lock nobody
    holds (their process died; another PID namespace sharing ``/dev/shm`` cannot fool this, as a
    pid could) are removed by the next instance. The files are removed when the pool stops."""

    def __init__(self) -> None:
        import secrets
        from collections import deque

        self.spool = _spool_dir()
        self.stem = f"{_SLOT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        self.free: deque[str] = deque()
        self.count = 0
        self.lock = threading.Lock()
        self.maps: dict[str, Any] = {}  # path -> pa.Buffer over this process's mapping
        self._lock_fd = _hold_lock(os.path.join(self.spool, self.stem + _LOCK_SUFFIX))
        self._remove_orphans()

    def take(self) -> str:
        try:
            return self.free.popleft()
        except IndexError:
            with self.lock:
                self.count += 1
                n = self.count
            return os.path.join(self.spool, f"{self.stem}-{n}{_SLOT_SUFFIX}")

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
        with self.lock:
            count = self.count
        for i in range(1, count + 1):
            _unlink(os.path.join(self.spool, f"{self.stem}-{i}{_SLOT_SUFFIX}"))
        self.maps.clear()
        self.free.clear()
        if self._lock_fd is not None:
            _unlink(os.path.join(self.spool, self.stem + _LOCK_SUFFIX))
            os.close(self._lock_fd)
            self._lock_fd = None

    def _remove_orphans(self) -> None:
        """Remove the slots of instances whose lock nobody holds (and slots with no lock)."""
        try:
            names = os.listdir(self.spool)
        except OSError:
            return
        live: dict[str, bool] = {}
        for name in names:
            if not name.startswith(_SLOT_PREFIX) or name.startswith(self.stem):
                continue
            if name.endswith(_LOCK_SUFFIX):
                stem = name[: -len(_LOCK_SUFFIX)]
            elif name.endswith(_SLOT_SUFFIX):
                stem = name[: -len(_SLOT_SUFFIX)].rsplit("-", 1)[0]
            else:
                continue
            if stem not in live:
                live[stem] = _held(os.path.join(self.spool, stem + _LOCK_SUFFIX))
            if not live[stem]:
                _unlink(os.path.join(self.spool, name))


_LOCK_SUFFIX = ".lock"


def _hold_lock(path: str) -> int | None:
    """An exclusive ``flock`` on ``path``, held until the descriptor closes: taken on a new
    0600 file that is then renamed to ``path``, so the lock file never shows unlocked."""
    import fcntl
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(prefix=_SLOT_PREFIX, suffix=".tmp",
                                   dir=os.path.dirname(path))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(tmp, path)
    except OSError:
        os.close(fd)
        _unlink(tmp)
        return None
    return fd


def _held(path: str) -> bool:
    """Whether a live process holds the lock at ``path`` (True when it cannot be told: another
    user's file, say; False when there is no lock file)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


class _Lease:
    """Held by every batch read from a slot (the base of their buffers): the slot goes back
    to the free ones when the last of them is gone."""

    __slots__ = ("buf", "path", "reuse", "slots")

    def __init__(self, slots: _Slots, path: str, buf: Any, reuse: bool = True) -> None:
        self.slots, self.path, self.buf, self.reuse = slots, path, buf, reuse

    def __del__(self) -> None:
        if self.reuse:
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

    #: the largest slot this worker has filled (a new slot starts at that size)
    largest = _SLOT_MIN_BYTES

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        #: the mappings handed out as arenas during this item: (address, size)
        self.bases: list[tuple[int, int]] = []
        got = self.maps.get(path)
        if got is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < _SlotSink.largest:
                    _reserve(fd, _SlotSink.largest)
            except _SlotFull:
                os.close(fd)
                raise
            got = self.maps[path] = (fd, self._map(fd))
        self.fd, self.mm = got

    def arena(self) -> memoryview:
        """The slot's mapping for the compiled builders to build buffers into (``_read.arena_set``):
        a view that keeps the mapping alive while any buffer built into it is."""
        import pyarrow as pa

        view = memoryview(self.mm)
        self.bases.append((pa.py_buffer(view).address, len(view)))
        return view

    def offset_of(self, address: int, size: int) -> int | None:
        """Where in the slot a buffer built into one of its arenas lies (None: elsewhere)."""
        for base, length in self.bases:
            if base <= address and address + size <= base + length:
                return address - base
        return None

    @staticmethod
    def _map(fd: int) -> Any:
        import mmap

        return mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        end = self.pos + n
        self._room(end)
        self.mm[self.pos:end] = view
        self.pos = end
        return n

    def _room(self, end: int) -> None:
        if end > len(self.mm):
            size = len(self.mm)
            while size < end:
                size *= 2
            _reserve(self.fd, size)
            _SlotSink.largest = max(_SlotSink.largest, size)
            old, self.mm = self.mm, self._map(self.fd)
            self.maps[self.path] = (self.fd, self.mm)
            try:
                old.close()
            except BufferError:
                pass  # buffers of this item built into it map it still: it goes with them

    def align(self) -> int:
        """The next write starts on a 64-byte boundary (Arrow's alignment); where it starts."""
        self.pos = (self.pos + 63) & ~63
        return self.pos

    def put(self, address: int, size: int) -> int:
        """``size`` bytes at ``address`` (a buffer of this process) copied into the slot, on a
        64-byte boundary; where they start."""
        import pyarrow as pa

        start = self.align()
        end = start + size
        self._room(end)
        if size:
            self.mm[start:end] = pa.foreign_buffer(address, size)
        self.pos = end
        return start

    def tell(self) -> int:
        return self.pos

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _reserve(fd: int, size: int) -> None:
    """The slot file at ``size`` bytes with every page allocated (a page written through a
    mapping of a full tmpfs would kill the process with SIGBUS; an allocation fails here)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        raise _SlotFull(str(e)) from e


def _run_piece(fn: Pairs, item: Any, slot: str, pure: str | None) -> _Result:
    """In a worker: ``fn(item)``'s batches written into the result slot ``slot``
    (:func:`_write_parts`: their buffers built there, the caller rebuilds the batches over its
    mapping; pickling them back would cost the caller as much CPU as decoding them did).
    ``pure``: the caller's ``$STATEQUERY_PURE_PYTHON`` (the decode path it asked for). The
    result: the slot, its size, the parts, and whether the slot may be reused once the caller
    is done with it."""
    from statequery.backends.fastpath import PURE_ENV
    from statequery.exceptions import StatequeryError

    global _in_worker
    _in_worker = True
    _keep_memory()
    if pure is None:
        os.environ.pop(PURE_ENV, None)
    else:
        os.environ[PURE_ENV] = pure

    parts: list[_Part] = []
    began = time.perf_counter()
    try:
        sink = _SlotSink(slot)
        arena = _arena_module()
        parts = _write_parts(fn, item, sink, arena)
    except _SlotFull:
        # no room for the result: the caller computes the item itself
        return slot, -1, [], True, time.perf_counter() - began
    except StatequeryError as e:
        raise _WorkerError(type(e), str(e), _picklable(e.__dict__)) from None
    # every buffer built into the slot is gone with the item's batches, unless something kept
    # one: then the slot is never reused (its bytes stay what that buffer holds) and this
    # worker builds no more buffers in slots
    reuse = arena is None or arena.arena_live() == 0
    if not reuse:
        global _arena_off
        _arena_off = True
    return slot, len(sink.mm), parts, reuse, time.perf_counter() - began


#: set in a worker when a buffer built into a slot outlived its item (see _run_piece)
_arena_off = False


def _arena_module() -> Any:
    """The compiled decode module when a worker builds buffers straight into its result slot
    (not on the pure path, not once a buffer outlived its item)."""
    if _arena_off:
        return None
    from statequery.backends import fastpath

    return fastpath.compiled()


def _write_parts(fn: Pairs, item: Any, sink: _SlotSink, arena: Any) -> list[_Part]:
    """``fn(item)``'s batches written into the slot: with ``arena`` (the compiled module) their
    buffers are built into the slot as they are decoded; a buffer built elsewhere is copied
    there; a batch of a type :func:`_plain_schema` rejects is written as Arrow IPC."""
    import pyarrow as pa

    parts: list[_Part] = []
    held: list[pa.RecordBatch] = []  # the item's batches (their buffers' addresses stay theirs)
    placed: dict[int, int] = {}
    out = None
    schema = None
    mapped = None
    if arena is not None:
        mapped = sink.mm
        arena.arena_set(sink.arena(), 0)
    try:
        for name, batch in fn(item):
            held.append(batch)
            if arena is not None:  # the slot's bytes up to here are the arena's
                sink.pos = max(sink.pos, arena.arena_pos())
            node = _place(batch, sink, placed) if _plain_schema(batch.schema) else None
            if node is not None:
                if schema is None or not (batch.schema is schema
                                          or batch.schema.equals(schema, check_metadata=True)):
                    schema = batch.schema
                    parts.append((name, _SCHEMA, schema))
                parts.append((name, _RAW, node))
            else:
                if out is None:
                    out = pa.PythonFile(sink, mode="w")
                start = sink.align()
                with pa.ipc.new_stream(out, batch.schema) as writer:
                    writer.write_batch(batch)
                parts.append((name, _IPC, (start, sink.pos - start)))
            if arena is not None:  # the next buffers after what was copied (in a grown slot)
                if sink.mm is not mapped:
                    mapped = sink.mm
                    arena.arena_set(sink.arena(), sink.pos)
                else:
                    arena.arena_seek(sink.pos)
    finally:
        if arena is not None:
            arena.arena_set(None)
    return parts


#: what a part of a worker's result is: ``_SCHEMA`` (the schema of the raw batches after it),
#: ``_RAW`` (a batch as its buffers in the slot: a :data:`_Node`), ``_IPC`` (a batch as an Arrow
#: IPC stream at ``(offset, length)`` in the slot: a type :func:`_plain_schema` rejects)
_SCHEMA, _RAW, _IPC = 0, 1, 2

#: a part: the state name, its kind, and the schema, node or IPC stream
_Part = tuple[str, int, Any]

#: an array as placed in a slot, the layout of the Arrow C data interface: ``(length, null
#: count, offset, buffers, children)``, each buffer ``(offset in the slot, size)`` or None
_Node = tuple[int, int, int, tuple[tuple[int, int] | None, ...], tuple[Any, ...]]


def _child_types(t: pa.DataType) -> list[pa.DataType] | None:
    """The types of the children of an array of type ``t`` in its C layout (a map's child is
    its entries struct), for the nested types that travel as buffers; None for any other."""
    import pyarrow as pa

    types = pa.types
    if types.is_struct(t):
        return [t.field(i).type for i in range(t.num_fields)]
    if types.is_map(t):
        return [pa.struct([t.key_field, t.item_field])]
    if types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t):
        return [t.value_type]
    return None


def _plain_type(t: pa.DataType) -> bool:
    """Whether an array of type ``t`` travels as its buffers: primitive, temporal, decimal,
    binary and string types, and lists, maps and structs of them. (Dictionaries, unions,
    views and extension types travel as IPC: their C layouts differ from their buffers.)"""
    import pyarrow as pa

    children = _child_types(t)
    if children is not None:
        return all(_plain_type(c) for c in children)
    types = pa.types  # (an extension type is none of these)
    return bool(types.is_null(t) or types.is_boolean(t) or types.is_integer(t)
            or types.is_floating(t) or types.is_temporal(t) or types.is_decimal(t)
            or types.is_string(t) or types.is_large_string(t) or types.is_binary(t)
            or types.is_large_binary(t) or types.is_fixed_size_binary(t))


_plain_cache: dict[Any, bool] = {}


def _plain_schema(schema: pa.Schema) -> bool:
    got = _plain_cache.get(schema)
    if got is None:
        got = _plain_cache[schema] = all(_plain_type(f.type) for f in schema)
        if len(_plain_cache) > 256:
            _plain_cache.clear()
    return got


def _c_array() -> Any:
    """The ``ArrowArray`` structure of the Arrow C data interface, as a ctypes type."""
    global _CArray
    if _CArray is None:
        import ctypes

        class CArray(ctypes.Structure):
            pass

        CArray._fields_ = [
            ("length", ctypes.c_int64), ("null_count", ctypes.c_int64),
            ("offset", ctypes.c_int64), ("n_buffers", ctypes.c_int64),
            ("n_children", ctypes.c_int64), ("buffers", ctypes.POINTER(ctypes.c_void_p)),
            ("children", ctypes.POINTER(ctypes.POINTER(CArray))),
            ("dictionary", ctypes.POINTER(CArray)),
            ("release", ctypes.CFUNCTYPE(None, ctypes.POINTER(CArray))),
            ("private_data", ctypes.c_void_p),
        ]
        _CArray = CArray
    return _CArray


_CArray: Any = None


class _NotPlain(Exception):
    """A batch whose C layout holds a buffer its arrays do not list (it travels as IPC)."""


def _place(batch: pa.RecordBatch, sink: _SlotSink, placed: dict[int, int]) -> _Node | None:
    """In a worker: ``batch``'s buffers copied into the slot (each once per piece: the slices
    of one chunk share their buffers; ``placed`` maps their addresses to their offsets) and its
    layout, read from its export through the Arrow C data interface (offsets, lengths and
    children as they are, so a slice travels as a slice). The caller rebuilds it over its
    mapping of the slot, with no copy (:func:`_rebuild`). None: it travels as IPC."""
    import ctypes

    sizes: dict[int, int] = {}
    for column in batch.columns:
        for buf in column.buffers():
            if buf is not None and sizes.get(buf.address, -1) < buf.size:
                sizes[buf.address] = buf.size
    c = _c_array()()
    batch._export_to_c(ctypes.addressof(c))
    try:
        if c.offset != 0 or c.dictionary:
            return None
        return _walk(c, sizes, sink, placed)
    except _NotPlain:
        return None
    finally:
        if c.release:
            c.release(ctypes.byref(c))


def _walk(c: Any, sizes: dict[int, int], sink: _SlotSink, placed: dict[int, int]) -> _Node:
    bufs: list[tuple[int, int] | None] = []
    for i in range(c.n_buffers):
        address = c.buffers[i]
        if not address:
            bufs.append(None)
            continue
        size = sizes.get(address)
        if size is None:
            raise _NotPlain(address)
        at = placed.get(address)
        if at is None:
            at = sink.offset_of(address, size)
            if at is None:
                at = sink.put(address, size)
            placed[address] = at
        bufs.append((at, size))
    kids = []
    for i in range(c.n_children):
        child = c.children[i].contents
        if child.dictionary:
            raise _NotPlain("dictionary")
        kids.append(_walk(child, sizes, sink, placed))
    return (c.length, c.null_count, c.offset, tuple(bufs), tuple(kids))


def _rebuild(t: pa.DataType, node: _Node, region: Any) -> pa.Array:
    """In the caller: an array of type ``t`` over ``region`` (its mapping of the slot) as the
    worker placed it (:func:`_place`)."""
    import pyarrow as pa

    length, nulls, offset, bufs, kids = node
    buffers = [None if b is None else region.slice(b[0], b[1]) for b in bufs]
    child_types = _child_types(t) or []
    if pa.types.is_null(t):
        buffers = [None]  # none in the C layout, one (absent) for from_buffers
    if len(child_types) != len(kids):
        raise ValueError(f"a worker's {t} array has {len(kids)} children")
    children = [_rebuild(ct, k, region) for ct, k in zip(child_types, kids, strict=True)]
    return pa.Array.from_buffers(t, length, buffers, nulls, offset, children or None)


def _picklable(attrs: dict[str, Any]) -> dict[str, Any]:
    """The attributes of an error that can travel back to the caller (the others as text)."""
    import pickle

    out: dict[str, Any] = {}
    for k, v in attrs.items():
        try:
            pickle.dumps(v)
            out[k] = v
        except Exception:  # noqa: BLE001 - anything unpicklable travels as its repr
            out[k] = repr(v)
    return out


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


def _unread(slots: _Slots, future: Future[_Result]) -> None:
    """A result nobody will read (the caller stopped early): its slot is free again."""
    if not future.cancelled() and future.exception() is None and future.result()[3]:
        slots.release(future.result()[0])


def _open_result(result: _Result, slots: _Slots) -> Any | None:
    """The slot of a worker's result as one buffer whose base is the slot's lease (the batches
    read from it hold it: the slot is reused once they are all gone); None when the worker gave
    the item back (no room) or the slot cannot be mapped (removed by :func:`shutdown` during
    the read): the slot is free again and the caller computes the item."""
    import pyarrow as pa

    path, size, _parts, reuse, _seconds = result
    if size < 0:
        slots.release(path)
        return None
    try:
        whole = slots.region(path, size)
    except OSError:
        if reuse:
            slots.release(path)
        return None
    return pa.foreign_buffer(whole.address, size, base=_Lease(slots, path, whole, reuse))


def _read_result(region: Any, parts: list[_Part]) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batches of a worker's result, read in place from its slot."""
    import pyarrow as pa

    schema = None
    for name, kind, what in parts:
        if kind == _SCHEMA:
            schema = what
        elif kind == _RAW:
            assert schema is not None
            columns = [_rebuild(f.type, node, region)
                       for f, node in zip(schema, what[4], strict=True)]
            batch = pa.RecordBatch.from_arrays(columns, schema=schema)
            batch.validate()
            yield name, batch
        else:
            offset, length = what
            reader = pa.ipc.open_stream(pa.BufferReader(region.slice(offset, length)))
            for batch in reader:
                yield name, batch


class _Schedule:
    """Who computes which item of one :func:`ordered_map`. The calling process streams the
    lowest item nobody claimed once it has yielded every item before it; a pool worker claims
    the lowest unclaimed item the caller reaches no sooner than the worker finishes it
    (:meth:`_pick`, from the times measured so far), so the two alternate and the caller
    finds a worker's item finished when it gets there; never more than ``ahead`` items past
    the one the caller yields next. A worker holds
    :data:`QUEUED_PER_WORKER` items (the next waits in its queue) and is given another as soon
    as it finishes one (from the pool's result thread)."""

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
        #: an item in a worker (its own time); when the caller began the item it computes
        self.t_here: float | None = None
        self.t_taken = 0.0
        self.t_pool: float | None = None
        self.here_began = time.perf_counter()

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

    def _pick(self) -> int | None:
        """The item a worker claims next (lock held): the lowest unclaimed one that the caller
        reaches no sooner than the worker finishes it, after the items it holds (the caller
        computing the unclaimed items before it and taking in the workers', each as long as
        they took so far), so that the caller finds a worker's item done when it gets there
        and both finish their shares together; at first the lowest unclaimed but one per item
        the worker holds. None: none left within ``ahead`` items of the caller."""
        queued = 1 + self.inflight // self.size
        if self.t_here is None or self.t_pool is None:
            index = self._lowest(queued)
            return None if index is None or index - self.pos > self.ahead else index
        done = queued * self.t_pool
        arrive = 0.0
        for i in range(self.pos, min(len(self.items), self.pos + self.ahead + 1)):
            if not self.claimed[i]:
                if arrive >= done:
                    return i
                arrive += self.t_here
            elif i in self.futures:  # a worker's: taken in
                arrive += self.t_taken
            else:  # the caller's, being computed
                arrive += max(0.0, self.t_here - (time.perf_counter() - self.here_began))
        return None

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
                    self.here_began = time.perf_counter()
                    return "here", pos, None
                if isinstance(f, Future):
                    return "pool", pos, f
                event = f
            event.wait()

    def taken(self, index: int) -> None:
        with self.lock:
            self.futures.pop(index, None)

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
                if self.closed or self.inflight >= self.size * QUEUED_PER_WORKER:
                    return
                index = self._pick()
                if index is None:
                    return
                self.claimed[index] = True
                self.inflight += 1
                slot = self.slots.take()
                event = self.futures[index] = threading.Event()
            try:
                hide = first and _may_start_processes(self.pool, self.size)
                with _main_hidden() if hide else nullcontext():
                    future = self.pool.submit(_run_piece, self.fn, self.items[index], slot,
                                              self.pure)
            except (RuntimeError, BrokenExecutor):
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
                return
            future.add_done_callback(partial(_release_unless_read, self.slots, slot))
            with self.lock:
                late = self.closed  # close() ran meanwhile: nobody will read this one
                if not late:
                    self.futures[index] = future
            event.set()
            if late:
                if not future.cancel():
                    future.add_done_callback(partial(_unread, self.slots))
                return
            future.add_done_callback(partial(self._done, index))

    def _warm_up(self) -> None:
        with self.lock:
            self.warming = True
            self.inflight += self.size
        try:
            futures = _submit_warm_ups(self.pool, self.size, _module_of(self.fn), False)
        except (RuntimeError, BrokenExecutor):  # shut down or broken: the caller reads
            with self.lock:
                self.closed = True
            return
        for future in futures:
            future.add_done_callback(self._warmed)

    def _warmed(self, future: Future[int]) -> None:
        with self.lock:
            self.inflight -= 1
            if future.cancelled() or future.exception() is not None:
                self.closed = True  # no worker to give items to: the caller reads them all
                return
            self.warmed += 1
            if self.warmed < self.size:
                return
        _mark_ready(self.pool)
        self.feed()

    def _done(self, index: int, future: Future[_Result]) -> None:
        ok = not future.cancelled() and future.exception() is None
        with self.lock:
            self.inflight -= 1
            if ok:  # the worker's own time (an item queued behind another waited meanwhile)
                took = future.result()[4]
                self.t_pool = took if self.t_pool is None else (self.t_pool + took) / 2
        if ok:
            self.feed()

    def stop(self) -> None:
        """No more items to the pool (the caller computes the rest; those given are read)."""
        with self.lock:
            self.closed = True

    def close(self) -> None:
        """The caller stopped (or finished): no more submissions; results nobody reads go."""
        with self.lock:
            self.closed = True
            futures = [f for f in self.futures.values() if isinstance(f, Future)]
            self.futures = {}
        for f in futures:
            if not f.cancel():
                f.add_done_callback(partial(_unread, self.slots))


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
    most ``2 * QUEUED_PER_WORKER`` items per worker past the one yielded next are claimed.
    ``fn`` and the items must pickle (a module-level function, frozen dataclasses)."""
    todo = list(items)
    run_here = local or fn
    if workers <= 1 or len(todo) <= 1:
        for item in todo:
            yield from run_here(item)
        return
    with _using_pool():
        yield from _ordered(fn, todo, run_here, workers)


def _ordered(
    fn: Pairs, todo: list[Any], run_here: Pairs, workers: int
) -> Iterator[tuple[str, pa.RecordBatch]]:
    pool, size = _get_pool(workers - 1)
    sched = _Schedule(pool, size, fn, todo, 2 * QUEUED_PER_WORKER * workers)
    try:
        sched.feed(first=True)
        while sched.pos < len(todo):
            move, index, future = sched.step()
            if move == "pool":
                assert future is not None
                try:
                    result: _Result | None = future.result()
                except _WorkerError as e:
                    raise e.rebuild() from None
                except (CancelledError, BrokenExecutor):
                    result = None  # the pool was shut down or a worker died
                sched.taken(index)  # its slot is this branch's now (close() must not free it)
                region = None if result is None else _open_result(result, sched.slots)
                if region is None:  # computed here, and the pool is not used further
                    sched.stop()
                    yield from run_here(todo[index])
                    sched.advance()
                    continue
                assert result is not None
                sched.advance()
                sched.feed(first=True)
                began = time.perf_counter()
                yield from _read_result(region, result[2])
                del region
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
