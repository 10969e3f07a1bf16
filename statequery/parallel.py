"""Every core: large reads run in a pool of worker processes (issue 33 item 2).

:func:`ordered_map` runs a function over items — the key-group ranges of a full scan,
``read_operator`` or ``export``, cut by :func:`statequery.scan.run_tasks` — in ``workers``
processes and yields their ``(state name, batch)`` pairs **in item order** (key-group order):
the same tables as the in-process path, cut into other batches. Workers write their batches to
Arrow IPC files in shared memory (``/dev/shm``) which the caller maps: no copy, no unpickling.
``workers=1`` is the in-process path; so is any read too small to pay for a pool (a lookup, a
key, fewer than :data:`MIN_PARALLEL_BYTES` of state files).

The number of workers: the ``workers=`` option, else ``$STATEQUERY_WORKERS``, else every core
this process may run on. The pool is started once per process, with the ``forkserver`` method
where there is one (``spawn`` elsewhere; never a plain ``fork`` of a process whose threads may
hold locks), its server importing statequery and pyarrow once; workers are forked from it. Scan
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
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from statequery.exceptions import InvalidOptionError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MIN_PARALLEL_BYTES",
    "WORKERS_ENV",
    "default_workers",
    "ordered_map",
    "resolve_workers",
    "shutdown",
]

#: the environment variable that sets the number of worker processes (default: every core)
WORKERS_ENV = "STATEQUERY_WORKERS"

#: a read of fewer bytes of state files than this stays in the calling process
MIN_PARALLEL_BYTES = 8 << 20

#: key-group ranges per worker a large task is cut into (balance against per-task overhead)
PIECES_PER_WORKER = 4


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


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["statequery.scan"])
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


def _submit(pool: ProcessPoolExecutor, fn: Pairs, item: Any, spool: str) -> Future[_Result]:
    from statequery.backends.fastpath import PURE_ENV

    with _main_hidden():
        return pool.submit(_run_piece, fn, item, spool, os.environ.get(PURE_ENV))


def shutdown() -> None:
    """Stop this process's worker pool (started again by the next parallel read)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


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
    """Where workers leave their results: shared memory when there is some (the caller maps the
    files, no copy), else the temporary directory."""
    import tempfile

    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


#: a worker's result: (state name, Arrow IPC stream file) in the order of the task's pairs
_Result = list[tuple[str, str]]


def _run_piece(fn: Pairs, item: Any, spool: str, pure: str | None) -> _Result:
    """In a worker: ``fn(item)``'s batches, written per state to an Arrow IPC file in ``spool``
    (pickling the batches back costs the caller as much CPU as decoding them did). ``pure``:
    the caller's ``$STATEQUERY_PURE_PYTHON`` (the decode path it asked for)."""
    import tempfile

    import pyarrow as pa

    from statequery.backends.fastpath import PURE_ENV
    from statequery.exceptions import StatequeryError

    global _in_worker
    _in_worker = True
    if pure is None:
        os.environ.pop(PURE_ENV, None)
    else:
        os.environ[PURE_ENV] = pure

    writers: dict[str, tuple[str, Any, Any]] = {}
    order: _Result = []
    try:
        for name, batch in fn(item):
            w = writers.get(name)
            if w is None:
                fd, path = tempfile.mkstemp(prefix="statequery-", suffix=".arrow", dir=spool)
                sink = pa.OSFile(path, "wb")
                os.close(fd)
                w = writers[name] = (path, sink, pa.ipc.new_stream(sink, batch.schema))
                order.append((name, path))
            w[2].write_batch(batch)
    except StatequeryError as e:
        _discard(writers)
        raise _WorkerError(type(e), str(e), dict(e.__dict__)) from None
    except BaseException:
        _discard(writers)
        raise
    for _path, sink, writer in writers.values():
        writer.close()
        sink.close()
    return order


def _discard(writers: dict[str, tuple[str, Any, Any]]) -> None:
    for path, sink, _writer in writers.values():
        sink.close()
        _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _drop_result(future: Future[_Result]) -> None:
    """A result nobody will read (the caller stopped early): its files go."""
    if future.cancelled() or future.exception() is not None:
        return
    for _name, path in future.result():
        _unlink(path)


def _read_result(result: _Result) -> Iterator[tuple[str, pa.RecordBatch]]:
    import pyarrow as pa

    for i, (name, path) in enumerate(result):
        try:
            source = pa.memory_map(path)  # the batches keep the mapping; the file can go
        finally:
            _unlink(path)
        try:
            batches = list(pa.ipc.open_stream(source))
        except BaseException:
            for _n, rest in result[i + 1:]:
                _unlink(rest)
            raise
        for batch in batches:
            yield name, batch


def ordered_map(
    fn: Pairs, items: Iterable[Any], workers: int
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """``fn(item)``'s ``(state name, batch)`` pairs for every item, in item order, computed in
    ``workers`` processes (at most two items per worker ahead of the caller). ``fn`` and the
    items must pickle (a module-level function, frozen dataclasses)."""
    pool = _get_pool(workers)
    spool = _spool_dir()
    window: deque[Future[_Result]] = deque()
    todo = iter(items)
    try:
        for item in todo:
            window.append(_submit(pool, fn, item, spool))
            if len(window) >= 2 * workers:
                break
        while window:
            try:
                result = window.popleft().result()
            except _WorkerError as e:
                raise e.rebuild() from None
            nxt = next(todo, None)
            if nxt is not None:
                window.append(_submit(pool, fn, nxt, spool))
            yield from _read_result(result)
    finally:
        for f in window:
            if not f.cancel():
                f.add_done_callback(_drop_result)
