"""A small Spark Connect client: SQL statements to a Connect server, their rows as Arrow.

``statequery sql --spark`` and ``statequery shell`` (:mod:`statequery.cli.sqlshell`) on a
running ``statequery serve`` use it instead of PySpark's Connect client, whose import alone
(pandas, numpy, PySpark's SQL package and its generated protocol modules) takes longer than the
query on a warm server. It speaks the same protocol (``spark.connect.SparkConnectService`` over
gRPC, Spark's ``base.proto``) with the few messages a statement needs, encoded here:
``ExecutePlan`` with a plan whose root is a ``SQL`` relation (Spark runs a command such as
``SHOW DATABASES`` eagerly and returns its rows, as ``spark.sql(...)`` does), the Arrow IPC
streams of the response's ``arrow_batch`` fields, ``Interrupt`` (Ctrl-C) and
``ReleaseSession``. A :class:`ConnectSession` keeps one session for several statements (a
``USE`` lasts) and names each operation, so that Ctrl-C interrupts that one. It imports only
``grpc`` and ``pyarrow``, both of which the ``spark`` extra brings. Anything else (DataFrames,
notebooks) is for PySpark's client: ``SparkSession.builder.remote(url)``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ConnectError", "ConnectSession", "Interrupted", "connect_error", "run_sql"]

_SERVICE = "/spark.connect.SparkConnectService/"
_CLIENT_TYPE = "statequery"

# Field numbers of spark/connect/base.proto and relations.proto (Spark 4.x)
_REQ_SESSION_ID, _REQ_USER_CONTEXT, _REQ_PLAN, _REQ_CLIENT_TYPE, _REQ_OPERATION_ID = 1, 2, 3, 4, 6
_USER_ID, _USER_NAME = 1, 2
_PLAN_ROOT = 1
_RELATION_SQL = 10
_SQL_QUERY = 1
_RESP_ARROW_BATCH = 2
_BATCH_DATA, _BATCH_CHUNK_INDEX, _BATCH_NUM_CHUNKS = 2, 4, 5
_RELEASE_SESSION_ID, _RELEASE_USER_CONTEXT, _RELEASE_CLIENT_TYPE = 1, 2, 3
_INTERRUPT_SESSION_ID, _INTERRUPT_USER_CONTEXT, _INTERRUPT_CLIENT_TYPE = 1, 2, 3
_INTERRUPT_TYPE, _INTERRUPT_OPERATION_ID = 4, 6
_INTERRUPT_TYPE_OPERATION_ID = 3
_INTERRUPTED_IDS = 2


class ConnectError(Exception):
    """The server refused the statement or could not be reached (its message, one line)."""


class Interrupted(Exception):
    """A statement stopped by Ctrl-C: the server was asked to interrupt it."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2: strings, bytes, messages)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _text(number: int, value: str) -> bytes:
    return _field(number, value.encode())


def _fields(message: bytes) -> Iterator[tuple[int, int, Any]]:
    """The (number, wire type, value) of each field of an encoded message: an int for varint
    and fixed fields, a memoryview for length-delimited ones."""
    view = memoryview(message)
    pos = 0
    end = len(view)

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= end:
                raise ConnectError("a truncated message from the Connect server")
            byte = view[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    while pos < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, varint()
        elif wire == 1:
            yield number, wire, int.from_bytes(view[pos:pos + 8], "little")
            pos += 8
        elif wire == 2:
            length = varint()
            yield number, wire, view[pos:pos + length]
            pos += length
        elif wire == 5:
            yield number, wire, int.from_bytes(view[pos:pos + 4], "little")
            pos += 4
        else:
            raise ConnectError(f"an unexpected protobuf wire type {wire} from the Connect server")


def _user_context() -> bytes:
    user = os.environ.get("USER") or "statequery"
    return _text(_USER_ID, user) + _text(_USER_NAME, user)


def _execute_request(session_id: str, query: str, operation_id: str | None = None) -> bytes:
    relation = _field(_RELATION_SQL, _text(_SQL_QUERY, query))
    return (
        _text(_REQ_SESSION_ID, session_id)
        + _field(_REQ_USER_CONTEXT, _user_context())
        + _field(_REQ_PLAN, _field(_PLAN_ROOT, relation))
        + _text(_REQ_CLIENT_TYPE, _CLIENT_TYPE)
        + (_text(_REQ_OPERATION_ID, operation_id) if operation_id else b"")
    )


def _arrow_streams(responses: Iterable[bytes]) -> Iterator[bytes]:
    """The Arrow IPC streams of a response stream, each batch's chunks put together."""
    pending: list[bytes] = []
    for response in responses:
        for number, wire, value in _fields(response):
            if number != _RESP_ARROW_BATCH or wire != 2:
                continue
            data = b""
            index, chunks = 0, 1
            for n, w, v in _fields(value):
                if n == _BATCH_DATA and w == 2:
                    data = bytes(v)
                elif n == _BATCH_CHUNK_INDEX and w == 0:
                    index = v
                elif n == _BATCH_NUM_CHUNKS and w == 0:
                    chunks = max(v, 1)
            pending.append(data)
            if index + 1 >= chunks:
                yield b"".join(pending)
                pending = []


class ConnectSession:
    """One session on a Spark Connect server: its statements share the current database and
    settings (``USE``, ``SET``); a statement stopped by Ctrl-C is interrupted on the server.
    ``close`` (or the end of a ``with`` block) releases the session."""

    def __init__(self, host: str, port: int, token: str | None = None) -> None:
        import grpc

        self.session_id = str(uuid.uuid4())
        # the server's pre-shared token (spark.connect.authenticate.token), as PySpark's client
        # sends it: a bearer token in each call's metadata (plain gRPC: the server is on
        # loopback)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        options = [("grpc.max_receive_message_length", 128 * 1024 * 1024)]
        self._channel = grpc.insecure_channel(f"{host}:{port}", options=options)
        self._execute = self._channel.unary_stream(_SERVICE + "ExecutePlan")

    def __enter__(self) -> ConnectSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sql(self, query: str, timeout: float | None = None) -> pa.Table:
        """Run one statement; its rows as a ``pyarrow.Table`` (a table without columns when
        it returns none). Ctrl-C (KeyboardInterrupt) cancels the call, asks the server to
        interrupt the operation and raises :class:`Interrupted`."""
        import grpc
        import pyarrow as pa

        operation_id = str(uuid.uuid4())
        call = None
        tables = []
        try:
            call = self._execute(_execute_request(self.session_id, query, operation_id),
                                 timeout=timeout, metadata=self._metadata)
            for stream in _arrow_streams(call):
                with pa.ipc.open_stream(stream) as reader:
                    tables.append(reader.read_all())
        except KeyboardInterrupt:  # wherever it came: the server is asked to stop the statement
            if call is not None:
                call.cancel()
            stopped = self._interrupt(operation_id)
            raise Interrupted(
                "interrupted: the server stopped the statement" if stopped
                else "interrupted: the server had no statement of ours running any more"
            ) from None
        except grpc.RpcError as e:
            raise ConnectError(_rpc_message(e)) from None
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def _interrupt(self, operation_id: str) -> bool:
        """Ask the server to interrupt the operation; whether it says it did."""
        import grpc

        interrupt = self._channel.unary_unary(_SERVICE + "Interrupt")
        try:
            response = interrupt(_text(_INTERRUPT_SESSION_ID, self.session_id)
                      + _field(_INTERRUPT_USER_CONTEXT, _user_context())
                      + _text(_INTERRUPT_CLIENT_TYPE, _CLIENT_TYPE)
                      + _varint(_INTERRUPT_TYPE << 3) + _varint(_INTERRUPT_TYPE_OPERATION_ID)
                      + _text(_INTERRUPT_OPERATION_ID, operation_id), timeout=10,
                      metadata=self._metadata)
        except grpc.RpcError:
            return False  # the server is gone: nothing of ours runs there any more
        return any(
            number == _INTERRUPTED_IDS and wire == 2 and bytes(value).decode() == operation_id
            for number, wire, value in _fields(response)
        )

    def close(self) -> None:
        import grpc

        release = self._channel.unary_unary(_SERVICE + "ReleaseSession")
        try:
            release(_text(_RELEASE_SESSION_ID, self.session_id)
                    + _field(_RELEASE_USER_CONTEXT, _user_context())
                    + _text(_RELEASE_CLIENT_TYPE, _CLIENT_TYPE), timeout=10,
                    metadata=self._metadata)
        except grpc.RpcError:
            pass  # the server drops idle sessions by itself
        finally:
            self._channel.close()


def run_sql(host: str, port: int, query: str, timeout: float | None = None,
            token: str | None = None) -> pa.Table:
    """Run ``query`` on the Spark Connect server at ``host:port`` in a session of its own
    (``token``: the server's, :func:`statequery.serverinfo.server_token`); its rows as a
    ``pyarrow.Table`` (an empty table without columns when it returns none)."""
    with ConnectSession(host, port, token=token) as session:
        return session.sql(query, timeout=timeout)


def _rpc_message(e: Any) -> str:
    details = e.details() if hasattr(e, "details") else None
    code = e.code() if hasattr(e, "code") else None
    text = str(details or code or e)
    return text


def connect_error(text: str) -> str:
    """One line for a Connect server's error: statequery's own message when the data source
    raised it, else Spark's first line."""
    found = re.findall(r"statequery\.exceptions\.\w+: (.*)", text)
    if found:
        return str(found[-1]).strip()
    return text.strip().splitlines()[0] if text.strip() else "the Spark Connect server failed"
