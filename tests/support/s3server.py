"""A local S3-compatible server for tests: moto in server mode on 127.0.0.1 (test extra
``moto[s3]`` with flask and flask-cors), in a thread of the test process, so it lives exactly as
long as the test run.

    with moto_s3_server() as s3:
        uri = s3.upload_tree(local_savepoint_dir, "savepoints/sp-1")   # s3://<bucket>/savepoints/sp-1
        statequery.open(uri, storage_options=s3.storage_options)
        subprocess.run([...], env={**os.environ, **s3.env})           # AWS_* for other processes

``storage_options`` are fsspec's (s3fs) arguments; ``env`` carries the same endpoint and
credentials as the standard AWS variables, which s3fs (through botocore) reads in processes
that get no storage options, e.g. Spark's executors (``spark.executorEnv.*``).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RequestCounter", "S3Server", "moto_s3_server"]

ACCESS_KEY = "statequery-test"
SECRET_KEY = "statequery-test-secret"
REGION = "us-east-1"


class RequestCounter:
    """WSGI middleware: counts requests by method (GETs with a Range header apart)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.paths: list[str] = []  # "METHOD /path" of every request, in order

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        method = environ.get("REQUEST_METHOD", "?")
        with self.lock:
            self.paths.append(f"{method} {environ.get('PATH_INFO', '')}")
        if method == "GET" and environ.get("HTTP_RANGE"):
            method = "GET (ranged)"
        with self.lock:
            self.counts[method] += 1
        return self.app(environ, start_response)

    def take(self) -> dict[str, int]:
        """The counts since the last call (and reset them)."""
        with self.lock:
            out = dict(self.counts)
            self.counts.clear()
        return out


@dataclass
class S3Server:
    """A running server: its endpoint, one bucket, and how to reach it."""

    endpoint_url: str
    bucket: str
    _server: Any = field(repr=False, default=None)

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options: ``statequery.open(uri, storage_options=...)``."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": REGION},
        }

    @property
    def env(self) -> dict[str, str]:
        """The same as environment variables (botocore >= 1.31 reads ``AWS_ENDPOINT_URL``)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": REGION,
        }

    def count_requests(self) -> RequestCounter:
        """Count the HTTP requests the server receives from now on (by method)."""
        wsgi = self._server._server  # moto's ThreadedMotoServer -> werkzeug's server
        if not isinstance(wsgi.app, RequestCounter):
            wsgi.app = RequestCounter(wsgi.app)
        return wsgi.app  # type: ignore[no-any-return]

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, region_name=REGION,
        )

    def upload_tree(self, local_dir: str | os.PathLike[str], prefix: str) -> str:
        """Copy every file under ``local_dir`` to ``prefix/`` in the bucket; returns the URI."""
        client = self.client()
        root = Path(local_dir)
        prefix = prefix.strip("/")
        for path in sorted(root.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), self.bucket, f"{prefix}/{path.relative_to(root)}")
        return f"s3://{self.bucket}/{prefix}"


@contextmanager
def moto_s3_server(bucket: str = "statequery-test") -> Iterator[S3Server]:
    """Start moto's S3 on a free loopback port with an empty ``bucket``; stop it on exit."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = S3Server(endpoint_url=f"http://{host}:{port}", bucket=bucket, _server=server)
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        server.stop()
