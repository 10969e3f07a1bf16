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
