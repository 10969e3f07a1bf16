"""Servers tests need, on loopback only, with a bounded lifetime (they stop by themselves)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class CountingServer:
    """An HTTP server on 127.0.0.1 that answers 200 with a few bytes and records every request."""

    port: int
    requests: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def counting_http_server(lifetime: float = 120.0) -> Iterator[CountingServer]:
    """Yield a :class:`CountingServer`; it shuts down on exit or after ``lifetime`` seconds."""
    record = CountingServer(0)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            record.requests.append(f"{self.command} {self.path}")
            payload = b"a,b\n1,2\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
            self._answer(True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(False)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    record.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    timer = threading.Timer(lifetime, server.shutdown)
    timer.daemon = True
    timer.start()
    try:
        yield record
    finally:
        timer.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class ProxyRecord:
    """What a :func:`flaky_proxy` saw: one ``(method, path, range header, status, body bytes)``
    per request, failures it injected included."""

    port: int
    requests: list[tuple[str, str, str, int, int]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def gets(self) -> list[tuple[str, str, str, int, int]]:
        return [r for r in self.requests if r[0] == "GET" and r[3] < 300]

    def reset(self) -> None:
        self.requests.clear()


@contextmanager
def flaky_proxy(upstream: str, failures: list[str] | None = None,
                lifetime: float = 300.0) -> Iterator[ProxyRecord]:
    """A reverse proxy on 127.0.0.1 in front of ``upstream`` (an S3 server) that counts requests
    and bytes; the first requests fail as listed in ``failures`` (``"503"``: a SlowDown answer,
    ``"reset"``: the connection is closed without an answer). Stops on exit or after
    ``lifetime`` seconds."""
    import http.client
    from urllib.parse import urlsplit

    target = urlsplit(upstream)
    pending = list(failures or [])
    record = ProxyRecord(0)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _proxy(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            with lock:
                action = pending.pop(0) if pending else None
            rng = self.headers.get("Range", "")
            if action == "reset":
                record.requests.append((self.command, self.path, rng, 0, 0))
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if action == "503":
                payload = (b"<?xml version='1.0'?><Error><Code>SlowDown</Code>"
                           b"<Message>Please reduce your request rate.</Message></Error>")
                record.requests.append((self.command, self.path, rng, 503, 0))
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Host"] = target.netloc
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            record.requests.append((self.command, self.path, rng, resp.status, len(data)))
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _proxy  # noqa: N815

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    record.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    timer = threading.Timer(lifetime, server.shutdown)
    timer.daemon = True
    timer.start()
    try:
        yield record
    finally:
        timer.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def static_http_server(root: str, lifetime: float = 120.0) -> Iterator[CountingServer]:
    """Serve the files under ``root`` on 127.0.0.1 (GET with ``Range``, HEAD), recording every
    request; 404 for anything else. Stops on exit or after ``lifetime`` seconds."""
    import os
    import re

    record = CountingServer(0)
    base = os.path.realpath(root)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            record.requests.append(f"{self.command} {self.path}")
            path = os.path.realpath(os.path.join(base, self.path.split("?")[0].lstrip("/")))
            if not path.startswith(base + os.sep) or not os.path.isfile(path):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with open(path, "rb") as f:
                data = f.read()
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if m:
                start = int(m.group(1))
                end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
                part = data[start : end + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            else:
                part = data
                self.send_response(200)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            if body:
                self.wfile.write(part)

        def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
            self._answer(True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(False)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    record.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    timer = threading.Timer(lifetime, server.shutdown)
    timer.daemon = True
    timer.start()
    try:
        yield record
    finally:
        timer.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
