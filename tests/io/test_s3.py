"""Remote storage for real: an S3-compatible server (moto in server mode) on loopback, started by
these tests and stopped with them. Inspect, read, lookup and RocksDB restore from ``s3://`` with
storage options from the API, the CLI and the environment (Spark executors); a lookup fetches what
it needs; transient errors are retried; a missing object is named; two endpoints never share a
cache entry."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from support.loopback import flaky_proxy
from support.s3server import S3Server, moto_s3_server

import statequery
from statequery.cli import main
from statequery.exceptions import StatequeryError, StorageError
from statequery.io import FileIO
from tests.conftest import fixture_dir

CANONICAL = "datastream-hashmap-canonical"
NATIVE = "datastream-rocksdb-native"
INCREMENTAL = "datastream-rocksdb-incremental-checkpoint"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with moto_s3_server() as server:
        server.upload_tree(fixture_dir(CANONICAL), "sp/canonical")
        server.upload_tree(fixture_dir(NATIVE), "sp/native")
        job = fixture_dir(INCREMENTAL).parent
        server.upload_tree(job, f"cp/{job.name}")
        yield server


def _uri(s3: S3Server, name: str) -> str:
    if name == INCREMENTAL:
        chk = fixture_dir(INCREMENTAL)
        return f"s3://{s3.bucket}/cp/{chk.parent.name}/{chk.name}"
    return f"s3://{s3.bucket}/sp/{'canonical' if name == CANONICAL else 'native'}"


def _everything(sp: Any) -> dict[str, list[str]]:
    out = {}
    for table in sp.state_meta().column("table_name").to_pylist():
        out[table] = sorted(map(repr, sp.read(table).to_pylist()))
    return out


def _lookup(sp: Any, key: str) -> list[tuple[str, list[str]]]:
    return sorted((str(k), sorted(map(repr, t.to_pylist()))) for k, t in sp.lookup(key).items())


@pytest.mark.parametrize("name", [CANONICAL, NATIVE, INCREMENTAL])
def test_inspect_read_lookup_from_s3(s3: S3Server, name: str) -> None:
    local = statequery.open(str(fixture_dir(name)), use_snapshot=False)
    remote = statequery.open(_uri(s3, name), storage_options=s3.storage_options,
                             use_snapshot=False)
    assert remote.state_meta().column("table_name").to_pylist() == (
        local.state_meta().column("table_name").to_pylist()
    )
    assert _everything(remote) == _everything(local)  # RocksDB: restored from s3:// objects
    assert _lookup(remote, "user-3") == _lookup(local, "user-3") != []


def test_cli_storage_options(s3: S3Server, capsys: pytest.CaptureFixture[str]) -> None:
    flags = [f"--storage-option={k}={json.dumps(v) if not isinstance(v, str) else v}"
             for k, v in s3.storage_options.items()]
    assert main(["inspect", _uri(s3, NATIVE), "--json", *flags]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "user_state__count" in json.dumps(doc)
    assert main(["lookup", _uri(s3, CANONICAL), "user-3", "--json", *flags]) == 0
    assert '"user-3"' in capsys.readouterr().out
    assert main(["read", _uri(s3, NATIVE), "user_state__count", "--key", "user-3", "--json",
                 *flags]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["value"] == 10
    assert main(["inspect", _uri(s3, NATIVE), "--storage-option", "oops"]) == 1
    assert "KEY=VALUE" in capsys.readouterr().err


def test_storage_options_from_the_environment(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What Spark executors use (``spark.executorEnv.STATEQUERY_STORAGE_OPTIONS``); the options
    also travel with a pickled FileIO."""
    monkeypatch.setenv("STATEQUERY_STORAGE_OPTIONS", json.dumps(s3.storage_options))
    io = FileIO()
    assert io.storage_options == s3.storage_options
    again = pickle.loads(pickle.dumps(io))
    sp = statequery.open(_uri(s3, CANONICAL), io=again, use_snapshot=False)
    assert sp.read("user_state__count", key="user-3").column("value").to_pylist() == [10]
    monkeypatch.setenv("STATEQUERY_STORAGE_OPTIONS", "{not json")
    with pytest.raises(StatequeryError, match="STATEQUERY_STORAGE_OPTIONS"):
        FileIO()


def test_lookup_fetches_what_it_needs(s3: S3Server) -> None:
    """Every GET is a range the reader asked for (no read-ahead): a lookup's bytes on the wire
    equal the bytes read through the seam, one key group plus headers."""
    with flaky_proxy(s3.endpoint_url) as proxy:
        io = FileIO(dict(s3.storage_options, endpoint_url=proxy.url))
        sp = statequery.open(_uri(s3, CANONICAL), io=io, use_snapshot=False)
        sp.state_meta()
        proxy.reset()
        io.stats.reset()
        assert _lookup(sp, "user-3")
        lookup_gets, lookup_bytes = len(proxy.gets()), sum(r[4] for r in proxy.gets())
        assert lookup_bytes == io.stats.total_bytes
        proxy.reset()
        io.stats.reset()
        _everything(sp)
        full_gets, full_bytes = len(proxy.gets()), sum(r[4] for r in proxy.gets())
        assert full_bytes == io.stats.total_bytes
    print(f"\ncanonical savepoint in S3: lookup {lookup_gets} GETs / {lookup_bytes} bytes; "
          f"full read {full_gets} GETs / {full_bytes} bytes")
    assert lookup_gets <= 8 and lookup_bytes * 4 < full_bytes


@pytest.mark.parametrize("failures", [["503", "503"], ["reset"], ["503", "reset", "503"]])
def test_transient_errors_are_retried(s3: S3Server, failures: list[str]) -> None:
    with flaky_proxy(s3.endpoint_url, failures=list(failures)) as proxy:
        opts = dict(s3.storage_options, endpoint_url=proxy.url)
        sp = statequery.open(_uri(s3, CANONICAL), storage_options=opts, use_snapshot=False)
        t = sp.read("user_state__count", key="user-3")
        assert t.column("value").to_pylist() == [10]
        statuses = [r[3] for r in proxy.requests[: len(failures)]]
    assert statuses == [503 if f == "503" else 0 for f in failures]


def test_missing_object_is_named(s3: S3Server) -> None:
    prefix = "sp/missing"
    uri = s3.upload_tree(fixture_dir(CANONICAL), prefix)
    sp = statequery.open(uri, storage_options=s3.storage_options, use_snapshot=False)
    op = next(o for o in sp.metadata.operators if o.uid == "user-state")
    handle = next(s.managed_keyed for s in op.subtasks if s.managed_keyed is not None)
    victim = sp.resolver.location(handle.delegate)
    s3.client().delete_object(Bucket=s3.bucket, Key=victim.split(f"{s3.bucket}/", 1)[1])
    with pytest.raises(StorageError) as info:
        statequery.open(uri, storage_options=s3.storage_options, use_snapshot=False).read(
            "user_state__count")
    assert victim in str(info.value)


@contextmanager
def _moto_in_a_subprocess(lifetime: float = 300.0) -> Iterator[S3Server]:
    """A second, independent S3 server: moto's backends are per process, so two servers in one
    process would share their buckets. Killed on exit or after ``lifetime`` seconds."""
    import socket
    import subprocess
    import sys
    import threading
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    watchdog = threading.Timer(lifetime, proc.kill)
    watchdog.daemon = True
    watchdog.start()
    try:
        server = S3Server(endpoint_url=f"http://127.0.0.1:{port}", bucket="statequery-test")
        deadline = time.monotonic() + 60
        while True:
            try:
                server.client().create_bucket(Bucket=server.bucket)
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield server
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait(timeout=30)


def test_two_endpoints_never_share_a_cache_entry() -> None:
    """The same bucket and object names on two S3 endpoints: B's RocksDB restore reads B's
    objects (here with one SST damaged, so it fails), never A's cached copies, and A's reads
    stay A's."""
    local = statequery.open(str(fixture_dir(NATIVE)), use_snapshot=False)
    want = _everything(local)
    with moto_s3_server() as a, _moto_in_a_subprocess() as b:
        uri = a.upload_tree(fixture_dir(NATIVE), "sp/native")
        assert b.upload_tree(fixture_dir(NATIVE), "sp/native") == uri
        sp_a = statequery.open(uri, storage_options=a.storage_options, use_snapshot=False)
        assert _everything(sp_a) == want  # A's files are now cached
        sst = next(
            k["Key"] for k in b.client().list_objects_v2(Bucket=b.bucket, Prefix="sp/native/")[
                "Contents"] if k["Size"] > 1000 and not k["Key"].endswith("_metadata")
        )
        body = bytearray(b.client().get_object(Bucket=b.bucket, Key=sst)["Body"].read())
        for i in range(64, min(len(body) - 64, 600)):
            body[i] ^= 0x5A
        b.client().put_object(Bucket=b.bucket, Key=sst, Body=bytes(body))
        sp_b = statequery.open(uri, storage_options=b.storage_options, use_snapshot=False)
        try:
            got = _everything(sp_b)
        except StatequeryError:
            got = None
        assert got != want
        assert _everything(statequery.open(uri, storage_options=a.storage_options,
                                           use_snapshot=False)) == want
