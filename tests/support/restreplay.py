"""Recorded REST conversations of real captures (tests/fixtures/rest/*.json), replayed.

Each file was recorded from a Flink 2.3.0 session cluster on loopback
(tests/support/flinkcluster.py) while statequery.capture ran against it: the calls in order,
with Flink's answers. The savepoint each conversation produced is committed beside
(tests/fixtures/capture-<job>/); ``relocate`` points the recorded location at a copy of it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from statequery.capture import CaptureError

REST = Path(__file__).parents[1] / "fixtures" / "rest"


def _replace(doc: Any, old: str, new: str) -> Any:
    text = json.dumps(doc)
    return json.loads(text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1]))


@dataclass
class Conversation:
    name: str
    job_id: str
    savepoint: str | None
    calls: list[dict[str, Any]]
    served: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, name: str) -> Conversation:
        doc = json.loads((REST / f"{name}.json").read_text())
        return cls(name, doc["job_id"], doc.get("savepoint"), doc["calls"])

    def relocate(self, new_parent: str) -> None:
        """Make the recorded savepoint location (``file:/tmp/.../savepoint-x``) point into
        ``new_parent``."""
        assert self.savepoint is not None
        old_parent = self.savepoint.rsplit("/", 1)[0]
        self.calls = _replace(self.calls, old_parent, new_parent)

    def answer(self, method: str, path: str) -> dict[str, Any]:
        """The next recorded call with this method and path (recorded polls repeat in order;
        the last one is kept for further polls)."""
        matching = [c for c in self.calls if c["method"] == method and c["path"] == path]
        if not matching:
            raise AssertionError(f"{self.name}: no recorded {method} {path}")
        n = sum(1 for s in self.served if s == f"{method} {path}")
        self.served.append(f"{method} {path}")
        return matching[min(n, len(matching) - 1)]


@dataclass
class ReplayRest:
    """A :class:`statequery.capture.FlinkRest` answering from a conversation."""

    conversation: Conversation
    url: str = "http://127.0.0.1:1"

    def _call(self, method: str, path: str) -> Any:
        call = self.conversation.answer(method, path)
        if "error" in call:
            raise CaptureError(call["error"].replace("{rest}", self.url))
        return call["response"]

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self._call("POST", path)


@contextmanager
def replay_server(conversation: Conversation, lifetime: float = 60.0) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering as the recorded cluster did; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            call = conversation.answer(self.command, self.path)
            if "error" in call:
                body, status = json.dumps({"errors": [call["error"]]}).encode(), 500
            else:
                body, status = json.dumps(call["response"]).encode(), 200
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _reply  # noqa: N815 - the http.server protocol

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    timer = threading.Timer(lifetime, server.shutdown)
    timer.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        timer.cancel()
        server.shutdown()
        server.server_close()
