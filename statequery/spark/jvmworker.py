"""The Python side of statequery's JVM data source (``statequery.DefaultSource``, see
:mod:`statequery.spark.jvm`): a long-lived process that plans and reads for the JVM.

The JVM starts a few of these per driver or executor (lazily, on the first query) and keeps them
for the next queries, so a query pays no Python start-up. Everything a read means is decided
here, by the same code as the Python data source (:class:`statequery.spark.StatequeryDataSource`
and its reader): the options, the schema, the partitions and the Arrow batches. The JVM only
moves bytes: it hands back the pickled reader and partitions it got from the planning, and turns
the Arrow IPC messages of a read into Spark's columnar batches (``ArrowColumnVector``).

Frames, both ways: one byte of kind, a 4-byte big-endian length, the payload.

JVM to worker: ``S`` (schema of options), ``P`` (plan: options and schema), ``R`` (read a
partition), and for the catalog plugin ``L`` (databases), ``T`` (tables), ``V`` (the version of
a ``TIMESTAMP AS OF``, ``W`` the versions of a ``CHANGES FROM TIMESTAMP``;
:mod:`statequery.spark.jvmcatalog`), each with a JSON payload; during a
read, single bytes ``N`` (one more batch may be sent) and ``C`` (stop; also the last byte of
every read).

Worker to JVM: ``H`` (once, at start: the protocol version), ``J`` (a JSON result), ``E`` (an
error: its Python type and message), and for a read ``A`` (the Arrow schema of the columns read),
``B`` (one Arrow IPC record batch message), ``K`` (the row count of a batch when no column is
read: ``count(*)``), ``Z`` (the end).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import struct
import sys
import traceback
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import pyarrow as pa

    from statequery.spark.source import StatequeryDataSource

#: the frame protocol's version, which the JVM checks (PythonWorker.PROTOCOL)
PROTOCOL = 1

_HEADER = struct.Struct(">cI")
_COUNT = struct.Struct(">q")

#: the readers a worker keeps unpickled (planned once, read by many partitions)
_READERS: OrderedDict[bytes, Any] = OrderedDict()
_MAX_READERS = 16


class _Closed(Exception):
    """The JVM closed the pipe: the worker exits."""


def _read_exact(inp: BinaryIO, n: int) -> bytes:
    data = inp.read(n)
    if len(data) != n:
        raise _Closed
    return data


def _read_frame(inp: BinaryIO) -> tuple[bytes, bytes]:
    kind, length = _HEADER.unpack(_read_exact(inp, _HEADER.size))
    return kind, _read_exact(inp, length)


def _write(out: BinaryIO, kind: bytes, payload: bytes | pa.Buffer) -> None:
    """One frame; ``payload``: bytes or a pyarrow Buffer (written without a copy)."""
    out.write(_HEADER.pack(kind, len(payload)))
    out.write(payload)


def _error(e: BaseException) -> bytes:
    kind = type(e)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    return json.dumps({
        "type": name,
        "message": str(e),
        "traceback": "".join(traceback.format_exception(e)),
    }).encode()


def _source(options: dict[str, str]) -> StatequeryDataSource:
    from statequery.spark import StatequeryDataSource

    return StatequeryDataSource(dict(options))


def schema(request: dict[str, Any]) -> dict[str, Any]:
    """The Spark schema (JSON) of a read with these options, as the Python data source's."""
    return {"schema": _source(request["options"]).schema().json()}


def plan(request: dict[str, Any]) -> dict[str, Any]:
    """The pickled reader and partitions of a read: the Python data source's ``reader(schema)``
    and ``partitions()``."""
    from pyspark.sql.types import StructType

    struct_type = StructType.fromJson(json.loads(request["schema"]))
    reader = _source(request["options"]).reader(struct_type)
    blob = pickle.dumps(reader, protocol=pickle.HIGHEST_PROTOCOL)
    _remember(blob, reader)
    return {
        "reader": base64.b64encode(blob).decode("ascii"),
        "partitions": [
            base64.b64encode(pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")
            for p in reader.partitions()
        ],
    }


def _remember(blob: bytes, reader: Any) -> None:
    _READERS[blob] = reader
    _READERS.move_to_end(blob)
    while len(_READERS) > _MAX_READERS:
        _READERS.popitem(last=False)


def _reader(blob: bytes) -> Any:
    reader = _READERS.get(blob)
    if reader is None:
        reader = pickle.loads(blob)
        _remember(blob, reader)
    else:
        _READERS.move_to_end(blob)
    return reader


def read(request: dict[str, Any], inp: BinaryIO, out: BinaryIO) -> None:
    """Stream one partition's batches (only the columns asked for), one per credit byte."""
    import pyarrow as pa

    cancelled = False
    try:
        reader = _reader(base64.b64decode(request["reader"]))
        partition = pickle.loads(base64.b64decode(request["partition"]))
        columns: list[str] = request["columns"]
        expected = _expected_schema(request.get("schema"))
        batches = reader.read(partition)
        if columns:
            names = reader.arrow_schema.names
            missing = [c for c in columns if c not in names]
            if missing:
                raise ValueError(f"no column(s) {missing} in {names}")
            schema = reader.arrow_schema
            schema = pa.schema([schema.field(c) for c in columns])
            if expected is not None and not expected.equals(schema):
                raise ValueError(
                    f"the batches have schema {schema}, Spark expects {expected}"
                )
            _write(out, b"A", schema.serialize())
        else:
            _write(out, b"A", b"")
        out.flush()
        first = True
        try:
            for batch in batches:
                if not batch.num_rows:
                    continue
                if first and not batch.schema.equals(reader.arrow_schema):
                    raise ValueError(
                        f"the reader yields schema {batch.schema}, not {reader.arrow_schema}"
                    )
                first = False
                credit = _read_exact(inp, 1)
                if credit == b"C":
                    cancelled = True
                    break
                if columns:
                    _write(out, b"B", batch.select(columns).serialize())
                else:
                    _write(out, b"K", _COUNT.pack(batch.num_rows))
                out.flush()
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # the reader's files closed now, also when cancelled
        _write(out, b"Z", b"")
    except _Closed:
        raise
    except Exception as e:  # noqa: BLE001 - every error goes back to the JVM, typed
        _write(out, b"E", _error(e))
    out.flush()
    if not cancelled:
        while _read_exact(inp, 1) != b"C":
            pass


def _expected_schema(text: str | None) -> pa.Schema | None:
    if not text:
        return None
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    return to_arrow_schema(StructType.fromJson(json.loads(text)), timezone="UTC")


#: ``STATEQUERY_JVMWORKER_TRACE=1``: one line on standard error per request: its wall clock, the
#: worker's CPU time and its time runnable but waiting for a core (Linux), for benchmarks
_TRACE = os.environ.get("STATEQUERY_JVMWORKER_TRACE") == "1"


def _trace(kind: bytes, start: float) -> None:
    import time

    try:
        with open("/proc/self/schedstat") as f:
            waited = int(f.read().split()[1]) / 1e9  # time runnable but waiting for a core
    except OSError:
        waited = 0.0
    print(f"statequery-worker {os.getpid()} {kind.decode()} start {start:.4f} "
          f"end {time.time():.4f} cpu {time.process_time():.4f} waited {waited:.4f}",
          file=sys.stderr, flush=True)


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer the JVM's requests until it closes the pipe."""
    import time

    import statequery

    _write(out, b"H", json.dumps(
        {"protocol": PROTOCOL, "statequery": getattr(statequery, "__version__", "?")}
    ).encode())
    out.flush()
    from statequery.spark import jvmcatalog

    handlers = {b"S": schema, b"P": plan, b"L": jvmcatalog.databases,
                b"T": jvmcatalog.tables, b"V": jvmcatalog.version_at,
                b"W": jvmcatalog.version_range}
    while True:
        try:
            kind, payload = _read_frame(inp)
        except _Closed:
            return
        start = time.time()
        request = json.loads(payload)
        if kind == b"R":
            try:
                read(request, inp, out)
            except _Closed:
                return
            if _TRACE:
                _trace(kind, start)
            continue
        try:
            result = handlers[kind](request)
        except Exception as e:  # noqa: BLE001 - every error goes back to the JVM, typed
            _write(out, b"E", _error(e))
        else:
            _write(out, b"J", json.dumps(result).encode())
        out.flush()
        if _TRACE:
            _trace(kind, start)


def main() -> None:
    # the frames own the real standard output; anything printed goes to standard error
    fd = os.dup(sys.stdout.fileno())
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ (Linux): fewer wake-ups per batch
    except (ImportError, OSError):
        pass
    out = os.fdopen(fd, "wb", buffering=1 << 16)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    inp = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=1 << 16)
    serve(inp, out)


if __name__ == "__main__":
    main()
