"""Handle confinement (issue 23): a state handle resolves only under its savepoint's own root
(same filesystem, host and port, bucket) or an allowed root, and a file resolves (symbolic links
followed) where its location says. Each test counts the requests or opens that reach outside.

The checkpoint is the real incremental RocksDB checkpoint, its ``_metadata`` edited so its
absolute handles name other places (``tests/metadata/test_trust.py``)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.checkpoints import FIXTURE, edited_copy, read_everything
from support.loopback import CountingServer, counting_http_server, static_http_server

import statequery
from statequery.exceptions import StorageError
from statequery.io import FileIO, is_under, same_store, store_of
from tests.conftest import fixture_dir

CANONICAL = "datastream-hashmap-canonical"


@pytest.fixture()
def evil() -> Iterator[CountingServer]:
    with counting_http_server() as s:
        yield s


def test_store_identity() -> None:
    assert store_of("http://127.0.0.1:18777/x") == ("http", "127.0.0.1", 18777)
    assert store_of("https://Example.com/x") == ("https", "example.com", 443)
    assert store_of("s3a://bucket/k") == ("s3", "bucket", None)
    assert store_of("memory:///bucket/k") == store_of("memory://bucket/other")
    assert store_of("/tmp/x") == store_of("file:/etc/y") == ("file", "", None)
    assert not same_store("http://127.0.0.1:8000/a", "http://127.0.0.1:18777/a")
    assert not same_store("http://127.0.0.1/a", "https://127.0.0.1/a")
    assert not same_store("s3://a/x", "s3://b/x")
    assert same_store("http://h/a", "http://h:80/b")
    assert not is_under("http://127.0.0.1:18777/sp/x", "http://127.0.0.1:8000/sp")
    assert is_under("memory:///b/sp/x", "memory://b/sp")


# -- http(s) -----------------------------------------------------------------------------------


def test_http_savepoint_cannot_reach_another_host_or_port(
    tmp_path: Path, evil: CountingServer
) -> None:
    """The issue's payload: handles of a checkpoint served over http name
    ``http://127.0.0.1:<other port>/latest/meta-data/iam/...``: refused, zero requests there."""
    with static_http_server(str(tmp_path)) as own:
        chk = edited_copy(tmp_path, lambda p: f"{evil.url}/latest/meta-data/iam/{p[-8:]}-creds")
        uri = f"{own.url}/{chk.relative_to(tmp_path)}/_metadata"
        with pytest.raises(StorageError, match=r"not on the savepoint's own store"):
            read_everything(uri)  # type: ignore[arg-type]
        assert own.requests  # the savepoint itself was read over http
    assert evil.requests == []


def test_https_savepoint_cannot_reach_another_port(tmp_path: Path) -> None:
    """The same over TLS (self-signed loopback certificates): https on another port is another
    store, and http on the same host is another filesystem."""
    from support.loopback import loopback_tls

    tls = loopback_tls(str(tmp_path))
    data = tmp_path / "data"
    data.mkdir()
    with static_http_server(str(data), tls=tls) as own, \
            counting_http_server(tls=tls) as evil, counting_http_server() as plain:
        for target in (evil.url, f"http://127.0.0.1:{own.port}", plain.url):
            data_dir = data / target.rsplit(":", 1)[1]
            chk = edited_copy(data_dir, lambda p, t=target: f"{t}/latest/meta-data/{p[-8:]}-x")
            uri = f"{own.url}/{chk.relative_to(data)}/_metadata"
            with pytest.raises(StorageError, match=r"refuses to read"):
                read_everything(uri, FileIO({"ssl": False}))  # type: ignore[arg-type]
        assert own.requests and own.scheme == "https"
    assert evil.requests == [] and plain.requests == []


def test_http_savepoint_reads_its_own_host(tmp_path: Path) -> None:
    """Absolute handles on the savepoint's own host and port are read (checkpoints use them)."""
    baseline = read_everything(fixture_dir(FIXTURE))
    with static_http_server(str(tmp_path)) as own:
        chk = edited_copy(tmp_path, lambda p: p)
        job = chk.parent.relative_to(tmp_path)
        moved = tmp_path / "moved"
        shutil.copytree(tmp_path / job / "shared", moved)
        chk = edited_copy(tmp_path / "b", lambda p: f"{own.url}/moved/{p.rsplit('/', 1)[1]}")
        shutil.rmtree(chk.parent / "shared")  # only the absolute location has the files
        uri = f"{own.url}/{chk.relative_to(tmp_path)}/_metadata"
        assert read_everything(uri) == baseline > 0  # type: ignore[arg-type]
        assert any(r.startswith("GET /moved/") for r in own.requests)


# -- s3 (moto) ---------------------------------------------------------------------------------


def test_s3_savepoint_cannot_reach_another_bucket(tmp_path: Path) -> None:
    from support.s3server import moto_s3_server

    with moto_s3_server() as s3:
        s3.client().create_bucket(Bucket="other-bucket")
        src = fixture_dir(FIXTURE).parent / "shared"
        for f in src.iterdir():  # the files exist there: a read would succeed
            s3.client().upload_file(str(f), "other-bucket", f"secret/{f.name}-x")
        chk = edited_copy(tmp_path, lambda p: f"s3://other-bucket/secret/{p.rsplit('/', 1)[1]}-x")
        uri = s3.upload_tree(chk.parent, "cp/job")
        counter = s3.count_requests()
        io = FileIO(s3.storage_options)
        with pytest.raises(StorageError, match=r"not on the savepoint's own store \(statequery"):
            read_everything(f"{uri}/{chk.name}", io)  # type: ignore[arg-type]
        assert counter.paths and all("other-bucket" not in p for p in counter.paths)
        assert all("other-bucket" not in loc for loc in io.stats.requests)
        # an allowed root opens it: the refusal is the store, not the scheme
        io = FileIO(s3.storage_options, allowed_roots=["s3://other-bucket/secret"])
        assert read_everything(f"{uri}/{chk.name}", io) == read_everything(  # type: ignore[arg-type]
            fixture_dir(FIXTURE))


# -- memory:// ---------------------------------------------------------------------------------


def _upload_memory(io: FileIO, local: Path, uri: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            io.write_atomic(f"{uri}/{path.relative_to(local)}", path.read_bytes())


def test_memory_savepoint_cannot_reach_another_bucket(tmp_path: Path) -> None:
    own, other = f"sq-own-{uuid.uuid4().hex[:8]}", f"sq-other-{uuid.uuid4().hex[:8]}"
    io = FileIO({})
    src = fixture_dir(FIXTURE).parent / "shared"
    for f in src.iterdir():
        io.write_atomic(f"memory://{other}/secret/{f.name}-x", f.read_bytes())
    chk = edited_copy(tmp_path, lambda p: f"memory://{other}/secret/{p.rsplit('/', 1)[1]}-x")
    _upload_memory(io, chk.parent, f"memory://{own}/job")
    try:
        io = FileIO({})
        with pytest.raises(StorageError, match=r"not on the savepoint's own store"):
            read_everything(f"memory://{own}/job/{chk.name}", io)  # type: ignore[arg-type]
        assert io.stats.requests and not [loc for loc in io.stats.requests if other in loc]
        assert not [loc for loc in io.stats.opens if other in loc]
    finally:
        for bucket in (own, other):
            FileIO({})._filesystem(f"memory://{bucket}").fs.rm(f"/{bucket}", recursive=True)


# -- local files and symbolic links ------------------------------------------------------------


@pytest.fixture()
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path ``os.open`` / ``open`` is asked to open, resolved (what the kernel opened)."""
    seen: list[str] = []
    real_os_open, real_open = os.open, open

    def os_open(path: object, *args: object, **kw: object) -> int:
        if isinstance(path, (str, Path)):
            seen.append(os.path.realpath(path))
        return real_os_open(path, *args, **kw)  # type: ignore[arg-type]

    def builtin_open(path: object, *args: object, **kw: object) -> object:
        if isinstance(path, (str, Path)):
            seen.append(os.path.realpath(path))
        return real_open(path, *args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr("builtins.open", builtin_open)
    return seen


def _canonical_copy(tmp_path: Path) -> tuple[Path, str]:
    src = fixture_dir(CANONICAL)
    sp = tmp_path / "sp" / src.name
    shutil.copytree(src, sp)
    return sp, "35c43c75-67c4-434b-9a81-93ef78b4a37b"  # the user-state operator's state file


def _rows(location: Path | str, io: FileIO | None = None) -> dict[str, int]:
    sp = statequery.open(str(location), io=io or FileIO(), use_snapshot=False)
    return {t: sp.read(t).num_rows for t in sp.state_meta().column("table_name").to_pylist()}


def test_state_file_symlinked_out_of_the_savepoint_is_refused(
    tmp_path: Path, opened: list[str]
) -> None:
    sp, name = _canonical_copy(tmp_path)
    baseline = _rows(sp)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    (sp / name).rename(secret)  # the very bytes: followed, the link would decode 391 rows
    (sp / name).symlink_to(secret)
    opened.clear()
    with pytest.raises(StorageError, match=r"resolves to .*secret, outside"):
        _rows(sp)
    assert str(secret) not in opened
    # also when the outside directory is an allowed root of a *different* savepoint's FileIO
    with pytest.raises(StorageError, match="outside"):
        _rows(sp, FileIO(allowed_roots=[str(sp)]))
    assert str(secret) not in opened
    # a link that stays inside the savepoint is followed
    (sp / name).unlink()
    (sp / "sub").mkdir()
    secret.rename(sp / "sub" / name)
    (sp / name).symlink_to(Path("sub") / name)
    assert _rows(sp) == baseline


def test_savepoint_directory_reached_through_a_link_is_fine(tmp_path: Path) -> None:
    sp, _ = _canonical_copy(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(sp.parent)
    assert _rows(link / sp.name) == _rows(sp)


def test_rocksdb_file_symlinked_out_of_the_checkpoint_is_refused(
    tmp_path: Path, opened: list[str]
) -> None:
    from statequery.backends.cache import FileCache

    chk = edited_copy(tmp_path, lambda p: p)
    shared = chk.parent / "shared"
    victim = sorted(shared.iterdir())[0]
    secret = tmp_path / "secret.sst"
    victim.rename(secret)
    victim.symlink_to(secret)
    opened.clear()
    with pytest.raises(StorageError, match="outside"):
        sp = statequery.open(str(chk), use_snapshot=False)
        for t in sp.state_meta().column("table_name").to_pylist():
            sp.read(t)
    assert str(secret) not in opened
    del FileCache


def test_allowed_root_symlink_escape_is_refused(tmp_path: Path, opened: list[str]) -> None:
    """Absolute handles under an allowed root: a file there linked to a file outside it."""
    root = tmp_path / "allowed"
    shutil.copytree(fixture_dir(FIXTURE).parent / "shared", root)
    chk = edited_copy(tmp_path / "cp", lambda p: "file:" + str(root / p.rsplit("/", 1)[1]))
    shutil.rmtree(chk.parent / "shared")
    baseline = read_everything(fixture_dir(FIXTURE))
    io: Callable[[], FileIO] = lambda: FileIO(allowed_roots=[str(root)])  # noqa: E731
    assert read_everything(chk, io()) == baseline
    victim = sorted(root.iterdir())[0]
    secret = tmp_path / "secret"
    victim.rename(secret)
    victim.symlink_to(secret)
    opened.clear()
    with pytest.raises(StorageError, match="outside"):
        read_everything(chk, io())
    assert str(secret) not in opened
