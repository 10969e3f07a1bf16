"""The process ``statequery.sql`` runs DuckDB in: a hard memory bound and a hard time bound that
hold for every function a query may call.

DuckDB's ``memory_limit`` governs its buffer manager (hash tables, sorts), not the strings and
lists a scalar function builds, and its ``interrupt()`` is only seen between vectors, not inside
one long ``replace`` or ``format``: ``replace`` nested nine times or ``format('{:>1073741824}',
...)`` grew a process to gigabytes and ran for a minute under a 256 MiB cap and a 5 s timeout
(issue 31). So the query runs here, in a child process started once and kept warm
(:class:`statequery.sql` keeps up to two idle), which

* lowers its own address-space limit (``RLIMIT_AS``) to what it has mapped plus the query's
  memory budget before DuckDB sees the query (planning included: DuckDB folds constant
  expressions while it plans), so an allocation past it fails in DuckDB as an
  ``Out of Memory Error``;
* interrupts DuckDB at the timeout and ends itself (``os._exit``) a grace period later;

while the parent watches its resident size and the wall clock and kills it past either (the
last word, whatever DuckDB does). The child reads the request, the catalog tables (Arrow IPC) and
the query on stdin and answers result batches on stdout; it imports only the standard library,
DuckDB and pyarrow, is never handed a path, and DuckDB in it is the locked-down connection of
:func:`connect`.

Frames: one byte of kind, eight bytes of little-endian length, the payload.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
from typing import IO, Any

#: DuckDB settings of the query connection, fixed before any query text reaches it and then locked
DUCKDB_CONFIG: dict[str, Any] = {
    "enable_external_access": False,  # no file, network, ATTACH, COPY, INSTALL or LOAD
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    "python_enable_replacements": False,  # a table name never resolves to a Python variable
    "temp_directory": "",  # never spill to disk
}

#: leaves of a DuckDB plan a query may have: the registered Arrow tables, CTE and recursive-CTE
#: scans, ``VALUES`` and a ``SELECT`` without ``FROM``. Anything else (``DUCKDB_SETTINGS`` behind
#: ``pg_settings``, ``DUCKDB_TABLES`` behind ``information_schema`` and ``sqlite_master``, a table
#: function, a stored table) is refused before the query runs.
PLAN_LEAVES = frozenset({
    "PYTHON_ARROW_SCAN", "ARROW_SCAN", "DUMMY_SCAN", "COLUMN_DATA_SCAN", "CTE_SCAN",
    "REC_CTE_SCAN", "DELIM_SCAN", "EMPTY_RESULT", "EXPRESSION_SCAN", "CHUNK_SCAN", "UNNEST",
})
#: table functions a plan may hold: the registered Arrow tables, and ``UNNEST`` (Spark's
#: ``explode``/``LATERAL VIEW``) over a list of the query
_SCANS_ALLOWED = frozenset({"PYTHON_ARROW_SCAN", "ARROW_SCAN", "UNNEST"})

#: exit status of a worker that ended itself at its hard deadline
EXIT_DEADLINE = 3


def connect(memory_limit: int, threads: int) -> Any:
    """A fresh in-memory DuckDB connection that can reach nothing but what is registered, with a
    memory cap of ``memory_limit`` bytes and ``threads`` threads; :func:`lock` it once the
    tables are registered."""
    import duckdb

    config = {**DUCKDB_CONFIG, "memory_limit": f"{max(1, memory_limit >> 20)}MiB",
              "threads": threads}
    con = duckdb.connect(":memory:", config=config)
    con.execute("SET TimeZone = 'UTC'")
    return con


def lock(con: Any) -> None:
    """No file system, and no setting of ``con`` can change any more."""
    con.execute("SET disabled_filesystems = 'LocalFileSystem'")
    con.execute("SET lock_configuration = true")


def plan_refusal(con: Any, select: str) -> str | None:
    """Why ``select`` may not run on ``con``, from the plan DuckDB makes of it (the names as
    DuckDB resolves them, CTE scopes included), or None."""
    plan = json.loads(con.execute("EXPLAIN (FORMAT JSON) " + select).fetchall()[0][1])
    todo = list(plan) if isinstance(plan, list) else [plan]
    while todo:
        node = todo.pop()
        name = str(node.get("name", "")).strip().upper()
        children = node.get("children") or []
        info = node.get("extra_info") or {}
        function = str(info.get("Function", "")).strip().upper() if isinstance(info, dict) else ""
        if (not children and name not in PLAN_LEAVES) or (
            function and name not in _SCANS_ALLOWED and function not in _SCANS_ALLOWED
        ):
            what = function or name
            return (f"the query reads {what.lower()}, which is not a catalog table "
                    "(statequery.sql reads only <database>.<table> and the query's own CTEs)")
        todo.extend(children)
    return None


# -- frames -------------------------------------------------------------------------------------

_HEAD = struct.Struct("<cQ")


def write_frame(out: IO[bytes], kind: bytes, payload: bytes) -> None:
    out.write(_HEAD.pack(kind, len(payload)))
    out.write(payload)


def read_frame(inp: IO[bytes]) -> tuple[bytes, bytes] | None:
    """The next frame, or None at the end of the stream."""
    head = inp.read(_HEAD.size)
    if len(head) < _HEAD.size:
        return None
    kind, size = _HEAD.unpack(head)
    payload = inp.read(size)
    if len(payload) < size:
        return None
    return kind, payload


def _status(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` in bytes (0 where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# -- the worker ---------------------------------------------------------------------------------


def _error(out: IO[bytes], kind: str, message: str) -> None:
    write_frame(out, b"E", json.dumps({"error": kind, "message": message}).encode())
    out.flush()


def _query(req: dict[str, Any], tables: dict[str, Any], out: IO[bytes]) -> None:
    import resource  # POSIX; the module is imported by statequery.sql everywhere

    import duckdb
    import pyarrow as pa

    con = connect(int(req["memory_limit"]), int(req["threads"]))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    timers: list[threading.Timer] = []
    fired = threading.Event()
    try:
        for name, table in tables.items():
            con.register(name, table)
        lock(con)
        statements = duckdb.extract_statements(req["text"])
        allowed = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)
        if len(statements) != 1 or statements[0].type not in allowed:  # defence in depth
            _error(out, "invalid", "only one SELECT query is accepted")
            return
        vm = _status("VmSize")
        if vm and req.get("budget"):
            limit = vm + int(req["budget"])
            if hard == resource.RLIM_INFINITY or limit < hard:
                resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        timeout = float(req["timeout"])

        def interrupt() -> None:
            fired.set()
            con.interrupt()

        timers = [threading.Timer(timeout, interrupt),
                  threading.Timer(timeout + float(req["grace"]), os._exit, (EXIT_DEADLINE,))]
        for t in timers:
            t.daemon = True
            t.start()
        write_frame(out, b"R", json.dumps({"rss": _status("VmRSS")}).encode())
        out.flush()
        refused = plan_refusal(con, req["select"])
        if refused:
            _error(out, "invalid", refused)
            return
        reader = con.sql(req["text"]).to_arrow_reader(8192)
        rows = size = 0
        max_rows, max_bytes = req.get("max_rows"), req.get("max_bytes")
        for batch in reader:
            rows += batch.num_rows
            size += batch.nbytes
            if max_rows is not None and rows > max_rows:
                _error(out, "rows", "")
                return
            if max_bytes is not None and size > max_bytes:
                _error(out, "bytes", "")
                return
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            write_frame(out, b"B", sink.getvalue().to_pybytes())
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, reader.schema):
            pass
        write_frame(out, b"S", sink.getvalue().to_pybytes())
        out.flush()
    except duckdb.Error as e:
        if fired.is_set() or isinstance(e, duckdb.InterruptException):
            _error(out, "timeout", "")
        elif isinstance(e, duckdb.OutOfMemoryException) or "Out of Memory" in str(e):
            _error(out, "memory", "")
        else:
            _error(out, "invalid", f"cannot run the query: {e}")
    except MemoryError:
        _error(out, "memory", "")
    except Exception as e:  # noqa: BLE001 - pyarrow and the rest fail in their own ways
        _error(out, "invalid", f"cannot run the query: {type(e).__name__}: {e}")
    finally:
        for t in timers:
            t.cancel()
        con.close()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _read_tables(inp: IO[bytes], names: list[str]) -> dict[str, Any] | None:
    import pyarrow as pa

    tables: dict[str, Any] = {}
    for name in names:
        schema = None
        batches: list[Any] = []
        while True:
            frame = read_frame(inp)
            if frame is None:
                return None
            kind, payload = frame
            if kind == b"T":
                break
            reader = pa.ipc.open_stream(pa.py_buffer(payload))
            schema = reader.schema
            batches.extend(reader)
        tables[name] = pa.Table.from_batches(batches, schema=schema)
    return tables


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """Answer requests from ``inp`` on ``out`` until ``inp`` ends."""
    try:
        import duckdb  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as e:
        _error(out, "missing", str(e))
        return
    write_frame(out, b"H", b"{}")
    out.flush()
    while True:
        frame = read_frame(inp)
        if frame is None:
            return
        req = json.loads(frame[1])
        tables = _read_tables(inp, list(req["tables"]))
        if tables is None:
            return
        _query(req, tables, out)
        out.flush()


def main() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a query ends
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing printed by a library can be taken for a frame
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
