"""Servers tests need, on loopback only, with a bounded lifetime (they stop by themselves)."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class CountingServer:
    """An HTTP server on 127.0.0.1 that answers 200 with a few bytes and records every request."""

    port: int
    requests: list[str] = field(default_factory=list)
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"


@dataclass
class LoopbackTLS:
    """A self-signed certificate for 127.0.0.1 (made with ``cryptography``, a test dependency
    through moto): ``context()`` for servers; clients skip verification (``ssl=False``)."""

    cert: str
    key: str

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def loopback_tls(directory: str) -> LoopbackTLS:
    import datetime
    import ipaddress
    import os

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(
            "127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return LoopbackTLS(cert_path, key_path)


def _serve(server: ThreadingHTTPServer, tls: LoopbackTLS | None) -> None:
    if tls is not None:
        server.socket = tls.context().wrap_socket(server.socket, server_side=True)


@contextmanager
def counting_http_server(lifetime: float = 120.0,
                         tls: LoopbackTLS | None = None) -> Iterator[CountingServer]:
    """Yield a :class:`CountingServer` (https with ``tls``); it shuts down on exit or after
    ``lifetime`` seconds."""
    record = CountingServer(0, scheme="https" if tls else "http")

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
    server.daemon_threads = True
    _serve(server, tls)
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
def static_http_server(root: str, lifetime: float = 120.0,
                       tls: LoopbackTLS | None = None,
                       redirect: Callable[[str, str], str | None] | None = None,
                       ) -> Iterator[CountingServer]:
    """Serve the files under ``root`` on 127.0.0.1 (GET with ``Range``, HEAD; https with
    ``tls``), recording every request; 404 for anything else. ``redirect(method, path)``, when
    it gives a URL, answers that request ``302 Found`` to it instead. Stops on exit or after
    ``lifetime`` seconds."""
    import os
    import re
    from urllib.parse import unquote

    record = CountingServer(0, scheme="https" if tls else "http")
    base = os.path.realpath(root)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            record.requests.append(f"{self.command} {self.path}")
            target = redirect(self.command, self.path) if redirect is not None else None
            if target is not None:
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            name = unquote(self.path.split("?")[0])  # a URL path: percent-decoded, as servers do
            path = os.path.realpath(os.path.join(base, name.lstrip("/")))
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
    _serve(server, tls)
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
