"""Trust boundaries: state handles in ``_metadata`` may make statequery read only files on the
savepoint's own filesystem, under the allowed roots. The savepoint here is the real incremental
RocksDB checkpoint, its ``_metadata`` edited so shared-file handles name other places."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.checkpoints import FIXTURE, edited_copy, read_everything
from support.loopback import CountingServer, counting_http_server

import statequery
from statequery.exceptions import StorageError
from statequery.io import FileIO, filesystem_of, is_under
from tests.conftest import fixture_dir


@pytest.fixture()
def server() -> Iterator[CountingServer]:
    with counting_http_server() as s:
        yield s


def test_handles_on_another_scheme_are_refused_before_any_request(
    tmp_path: Path, server: CountingServer
) -> None:
    chk = edited_copy(tmp_path, lambda p: f"{server.url}/latest/meta-data/iam/{p[-8:]}-creds")
    with pytest.raises(StorageError, match=r"refuses to read: it is on http://") as info:
        read_everything(chk)
    assert "own filesystem (file)" in str(info.value)
    with pytest.raises(StorageError):
        statequery.open(str(chk), use_snapshot=False).lookup("user-3")
    assert server.requests == []


def test_foreign_handles_still_remap_onto_the_own_tree(
    tmp_path: Path, server: CountingServer
) -> None:
    """A checkpoint copied from another store keeps its old URIs: they are matched onto the
    checkpoint's own ``shared/`` directory by name, with no request to the old store."""
    baseline = read_everything(fixture_dir(FIXTURE))
    chk = edited_copy(tmp_path, lambda p: f"{server.url}/old-store/shared/{p.rsplit('/', 1)[1]}")
    assert read_everything(chk) == baseline > 0
    chk2 = edited_copy(tmp_path / "s3", lambda p: "s3://other-bucket/shared/" + p.rsplit("/")[-1])
    assert read_everything(chk2) == baseline
    assert server.requests == []


def test_allowed_roots(tmp_path: Path) -> None:
    """Absolute handles to files outside the savepoint's tree: read by default (normal for
    checkpoints), refused when the FileIO has allowed roots that do not cover them."""
    outside = tmp_path / "elsewhere"
    src_shared = fixture_dir(FIXTURE).parent / "shared"
    shutil.copytree(src_shared, outside)

    def elsewhere(p: str) -> str:
        return "file:" + str(outside / ("moved-" + p.rsplit("/", 1)[1]))

    for f in list(outside.iterdir()):
        f.rename(outside / ("moved-" + f.name))
    chk = edited_copy(tmp_path / "cp", elsewhere)
    baseline = read_everything(fixture_dir(FIXTURE))
    assert read_everything(chk) == baseline
    assert read_everything(chk, FileIO(allowed_roots=[str(outside)])) == baseline
    with pytest.raises(StorageError, match="outside the allowed roots"):
        read_everything(chk, FileIO(allowed_roots=[str(tmp_path / "cp")]))
    # the allow-list also comes from the environment and survives pickling (Spark executors)
    import pickle

    io = pickle.loads(pickle.dumps(FileIO(allowed_roots=["s3://b/x"])))
    assert io.allowed_roots == ("s3://b/x",)


def test_relative_handles_stay_inside_the_savepoint() -> None:
    from statequery.io import join_location

    for bad in ("../x", "a/../../x", "/etc/passwd", "http://h/x", "file:/etc/passwd"):
        with pytest.raises(StorageError):
            join_location("/sp/savepoint-1", bad)
    assert join_location("/sp/savepoint-1", "a/../b") == "/sp/savepoint-1/b"


def test_location_helpers() -> None:
    assert filesystem_of("/x") == filesystem_of("file:/x") == "file"
    assert filesystem_of("s3a://b/k") == "s3"
    assert is_under("s3://b/sp/shared/x", "s3://b/sp")
    assert not is_under("s3://b/spx/y", "s3://b/sp")
    assert not is_under("s3://c/sp/y", "s3://b/sp")
    assert not is_under("http://b/sp/y", "s3://b/sp")
    assert is_under("/a/b/../b/c", "/a/b") and not is_under("/a/bc", "/a/b")


def test_tampered_snapshot_falls_back_to_metadata(tmp_path: Path) -> None:
    """Flipped bytes that still unpack (a state renamed) no longer change listings silently."""
    from statequery.exceptions import SnapshotIgnoredWarning
    from statequery.metadata.statemeta import SNAPSHOT_FILE_NAME

    src = fixture_dir("datastream-hashmap-canonical")
    sp_dir = tmp_path / src.name
    shutil.copytree(src, sp_dir)
    derived = statequery.open(str(sp_dir), use_snapshot=False)
    names = sorted(s.name for s in derived.states)
    derived.write_snapshot()
    assert statequery.open(str(sp_dir)).from_snapshot
    snap = sp_dir / SNAPSHOT_FILE_NAME
    data = snap.read_bytes()
    assert data.count(b"recent-categories") >= 1
    snap.write_bytes(data.replace(b"recent-categories", b"recent-catXgories"))
    with pytest.warns(SnapshotIgnoredWarning, match="checksum mismatch"):
        sp = statequery.open(str(sp_dir))
    assert not sp.from_snapshot
    assert sorted(s.name for s in sp.states) == names
    assert sp.read("user_state__recent_categories").num_rows > 0
