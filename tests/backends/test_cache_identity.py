"""The cache is never wrong: entries are keyed by the object's full identity and its current
version, and stay valid for readers while other threads and processes evict."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import statequery
from statequery.backends.cache import CacheKey, FileCache
from statequery.io import FileIO
from tests.conftest import fixture_dir

NATIVE = "datastream-rocksdb-native"


def test_rewritten_file_of_the_same_size_is_fetched_again(tmp_path: Path) -> None:
    src = tmp_path / "state-file"
    src.write_bytes(b"A" * 4096)
    cache = FileCache(tmp_path / "cache")
    io = FileIO()
    cache.link(io, CacheKey(str(src), 4096), str(tmp_path / "first"))
    assert (tmp_path / "first").read_bytes() == b"A" * 4096
    (tmp_path / "new").write_bytes(b"B" * 4096)
    os.replace(tmp_path / "new", src)  # rewritten, same size, same name
    cache.link(io, CacheKey(str(src), 4096), str(tmp_path / "second"))
    assert (tmp_path / "second").read_bytes() == b"B" * 4096
    assert (tmp_path / "first").read_bytes() == b"A" * 4096  # a reader's link is untouched


def test_local_file_rewritten_with_kept_mtime_is_read_as_it_is_now(tmp_path: Path) -> None:
    """``cp -p`` / ``touch -r``: same size, same inode, same mtime, new bytes. Local files are
    read in place, never from a cached copy (issue 23)."""
    src = tmp_path / "state-file"
    src.write_bytes(b"A" * 4096)
    before = os.stat(src)
    cache = FileCache(tmp_path / "cache")
    io = FileIO()
    cache.link(io, CacheKey(str(src), 4096), str(tmp_path / "first"))
    assert (tmp_path / "first").read_bytes() == b"A" * 4096
    with open(src, "r+b") as f:  # in place: the inode stays
        f.write(b"B" * 4096)
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(src)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns)
    cache.link(io, CacheKey(str(src), 4096), str(tmp_path / "second"))
    assert (tmp_path / "second").read_bytes() == b"B" * 4096
    assert cache.entries() == []  # no copy of a local file is kept
    # a segment of a local file, too
    cache.link(io, CacheKey(str(src), 100, offset=10), str(tmp_path / "segment"))
    assert (tmp_path / "segment").read_bytes() == b"B" * 100


def test_local_file_is_linked_in_place_not_copied(tmp_path: Path) -> None:
    """A local file is placed in a DB directory as itself (a hard link to the very file opened
    through the seam): one open, no byte read, nothing written to the file."""
    src = tmp_path / "savepoint" / "state-file"
    src.parent.mkdir()
    src.write_bytes(b"A" * 4096)
    before = os.stat(src)
    cache = FileCache(tmp_path / "cache")
    io = FileIO()
    dest = tmp_path / "db-file"
    cache.link(io, CacheKey(str(src), 4096), str(dest))
    assert (os.stat(dest).st_dev, os.stat(dest).st_ino) == (before.st_dev, before.st_ino)
    assert io.stats.opens[str(src)] == 1
    assert io.stats.bytes_read[str(src)] == 0
    after = os.stat(src)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert sorted(os.listdir(src.parent)) == ["state-file"]
    assert cache.entries() == []


def test_a_path_that_names_another_file_by_now_is_not_linked(tmp_path: Path) -> None:
    """The link goes through the path the kernel gives for the opened file, and is kept only
    when it is that very file: an opened file removed since is reported as ``<path>
    (deleted)``, and another file under that name is not linked in its place."""
    from statequery.backends.cache import _link_open_file

    src = tmp_path / "state-file"
    src.write_bytes(b"A" * 4096)
    dest = tmp_path / "db-file"
    with open(src, "rb") as opened:
        assert _link_open_file(opened.fileno(), str(dest))
        assert os.stat(dest).st_ino == os.fstat(opened.fileno()).st_ino
        dest.unlink()
        src.unlink()
        impostor = tmp_path / "state-file (deleted)"
        impostor.write_bytes(b"B" * 4096)
        assert os.readlink(f"/proc/self/fd/{opened.fileno()}") == str(impostor)
        assert not _link_open_file(opened.fileno(), str(dest))
        assert not dest.exists()
        assert impostor.read_bytes() == b"B" * 4096


def test_endpoint_is_part_of_the_identity() -> None:
    a = FileIO({"endpoint_url": "http://127.0.0.1:9001"})
    b = FileIO({"client_kwargs": {"endpoint_url": "http://127.0.0.1:9002"}})
    assert a.endpoint("s3://bucket/x") == "http://127.0.0.1:9001"
    assert b.endpoint("s3://bucket/x") == "http://127.0.0.1:9002"
    assert FileIO().endpoint("/local/x") == ""
    ka = CacheKey("s3://bucket/x", 10, endpoint=a.endpoint("s3://bucket/x"), version="ETag=1")
    kb = CacheKey("s3://bucket/x", 10, endpoint=b.endpoint("s3://bucket/x"), version="ETag=1")
    assert ka.digest != kb.digest
    assert CacheKey("s3://bucket/x", 10, version="ETag=2").digest != ka.digest


def _rows_of(location: str) -> dict[str, Any]:
    sp = statequery.open(location, io=FileIO(), use_snapshot=False)
    out = {}
    for table in sp.state_meta().column("table_name").to_pylist():
        t = sp.read(table)
        out[table] = sorted(map(repr, t.to_pylist()))
    for key in ("user-1", "user-3", "user-7"):
        found = sp.lookup(key)
        out[f"lookup {key}"] = sorted(
            (str(k), sorted(map(repr, v.to_pylist()))) for k, v in found.items()
        )
    return out


def _hammer(args: tuple[str, str, int]) -> tuple[list[str], list[dict[str, Any]]]:
    """4 threads, each reading everything ``rounds`` times through one tiny shared cache."""
    location, cache_root, rounds = args
    os.environ["STATEQUERY_CACHE_DIR"] = cache_root
    os.environ["STATEQUERY_CACHE_MAX_BYTES"] = "1"  # every restore evicts all it can
    errors: list[str] = []
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def run() -> None:
        for _ in range(rounds):
            try:
                rows = _rows_of(location)
            except BaseException as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            with lock:
                results.append(rows)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors, results


def test_two_processes_four_threads_under_eviction_pressure(tmp_path: Path) -> None:
    location = str(fixture_dir(NATIVE))
    want = _rows_of(location)
    assert want["lookup user-3"]
    root = str(tmp_path / "cache")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        outcomes = pool.map(_hammer, [(location, root, 3), (location, root, 3)])
    errors = [e for errs, _ in outcomes for e in errs]
    results = [r for _, rs in outcomes for r in rs]
    assert errors == []
    assert len(results) == 2 * 4 * 3
    wrong = [i for i, r in enumerate(results) if r != want]
    assert wrong == []
    cache = FileCache(root, max_bytes=1)
    cache.evict()
    assert os.listdir(os.path.join(root, "db")) == []  # every DB directory was closed


def test_a_link_swapped_while_the_cache_checks_the_savepoint_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``FileCache.check_outside`` resolves the savepoint directory: when the link it follows is
    replaced by a file between lstat and readlink, the kernel answers ``EINVAL``, a
    StorageError naming the directory (the real rename, the real readlink)."""
    import errno
    import shutil

    from statequery.exceptions import StorageError

    (tmp_path / "real").mkdir()
    victim = tmp_path / "sp"
    victim.symlink_to(tmp_path / "real")
    real_readlink = os.readlink
    swaps: list[str] = []

    def readlink(path: str | os.PathLike[str], *args: object, **kw: object) -> str:
        if os.fspath(path) == str(victim) and not swaps:
            swaps.append(str(victim))
            tmp = tmp_path / "swap"
            tmp.write_bytes(b"")
            os.replace(tmp, victim)  # the link is now a regular file
        return real_readlink(path, *args, **kw)  # type: ignore[arg-type]

    cache = FileCache(tmp_path / "cache")
    monkeypatch.setattr(os, "readlink", readlink)
    with pytest.raises(StorageError, match=r"cannot check where .*sp or the cache") as e:
        cache.check_outside(str(victim))
    assert swaps == [str(victim)]
    cause = e.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.EINVAL
    shutil.rmtree(tmp_path / "real")
