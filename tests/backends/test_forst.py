"""ForSt (``state.backend.type: forst``, Flink 2.x): what its snapshots hold.

ForSt is a fork of RocksDB and writes RocksDB's files and handles: statequery reads them as it
reads RocksDB's (the fixtures ``datastream-forst-native`` and ``datastream-forst-checkpoint`` are
in every fixture suite, against a dump made by ForSt's own restore, ``SavepointDump
--backend=forst``). What differs is its defaults: partitioned (two-level) indexes and filters,
which the table reader's lookups walk (``tests/backends/test_rocksdb_tables.py``).

Jobs on the asynchronous state API (State V2: ``AsyncStateJob``'s ``enableAsyncState()`` keyed
process function, and the SQL job with ``table.exec.async-state.enabled``) run on ForSt's
asynchronous backend: their headers hold ``KEY_VALUE_V2`` states, and their checkpoints reference
the database's own tables in ForSt's working directory under ``<job-id>/shared/`` (its primary
directory is the checkpoint directory). Below, each such fixture equals ForSt's own restore entry
by entry on both decode paths, lookups equal filtered full reads, and ``state_meta`` names the
backend ``forst``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import FIXTURES as FIXTURES_ROOT
from conftest import dump_entries, expected_entries, fixture_dir, fixture_record
from support.entries import canonical, mask_any, savepoint_entries
from support.s3server import S3Server, moto_s3_server

import statequery
import statequery.backends.rocksdb as rocks
from statequery.backends.cache import FileCache
from statequery.backends.sst import SstFile
from statequery.metadata.handles import FileHandle

FORST = ["datastream-forst-native", "datastream-forst-checkpoint"]
S3_CHECKPOINT = "async-datastream-forst-s3-checkpoint"
ASYNC = ["async-datastream-forst-checkpoint", "async-datastream-forst-native",
         "async-sql-forst-native", S3_CHECKPOINT]


@pytest.mark.parametrize("name", FORST)
def test_forst_tables_have_two_level_indexes(name: str) -> None:
    record = fixture_record(name)
    assert (record["backend"], record["state_backend"]) == ("rocksdb", "forst")
    sp = statequery.open(str(fixture_dir(name)), use_snapshot=False)
    kinds = set()
    for op in sp.meta.operators:
        for st in op.subtasks:
            h = st.keyed_handle
            if h is None:
                continue
            for path, stream in (*h.private, *h.shared):
                if path.endswith(".sst"):
                    with SstFile(sp.resolver.location(stream)) as t:
                        kinds.add(t.properties.index_type)
    assert kinds == {2}  # kTwoLevelIndexSearch in every table
    assert sp.state_meta().num_rows == 15


def _open(name: str) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False)


@pytest.mark.parametrize("name", ASYNC)
def test_async_state_equals_forst_restore(name: str, decode_path: str) -> None:
    """Every entry of every state equals ForSt's own restore (with key groups) and the job model
    (without), on the compiled and the pure-Python decode path."""
    sp = _open(name)
    mine = savepoint_entries(sp, key_group=True)
    dump = sorted(canonical(e) for e in dump_entries(name))
    assert mine == dump
    want = expected_entries(name)
    got = sorted(canonical(e) for e in mask_any(
        [json.loads(x) for x in savepoint_entries(sp, key_group=False)], want))
    assert got == sorted(canonical(e) for e in want)
    # State V2 in the headers: every managed keyed state of the keyed operator
    keyed = [s for op in sp.meta.operators for s in op.states
             if s.kind in ("value", "list", "map", "reducing", "aggregating")]
    assert keyed and {s.backend_type for s in keyed} == {"KEY_VALUE_V2"}


@pytest.mark.parametrize("name", ASYNC)
def test_async_lookup_equals_filtered_full_read(name: str, decode_path: str) -> None:
    sp = _open(name)
    op = next(o for o in sp.keyed_operators())
    full = {st.name: sp.read(op.operator_id, st.name).to_pylist() for st in op.states}
    keys: list[Any] = []
    for rows in full.values():
        keys += [r["key"] for r in rows if "key" in r and r["key"] not in keys]
    assert len(keys) >= 17
    for key in keys[:3] + keys[-2:]:
        got = {state: t.to_pylist() for (_, state), t in sp.lookup(key, op.operator_id).items()}
        want = {state: [r for r in rows if r.get("key") == key]
                for state, rows in full.items()}
        assert got == {state: rows for state, rows in want.items() if rows}


@pytest.mark.parametrize("name", ASYNC)
def test_state_meta_names_forst(name: str) -> None:
    record = fixture_record(name)
    assert (record["backend"], record["state_backend"]) == ("rocksdb", "forst")
    sp = _open(name)
    assert sp.backend == "forst"
    keyed = [r for r in sp.state_meta().to_pylist() if r["key_type"]]
    assert keyed and {r["backend"] for r in keyed} == {"forst"}


def test_async_checkpoint_references_forst_working_directory() -> None:
    """The disaggregated layout: the checkpoint's tables are ForSt's database files in its
    working directory under the job's ``shared/`` (absolute ``file:`` paths into the generator's
    scratch directory, mapped onto the fixture's own tree)."""
    sp = _open("async-datastream-forst-checkpoint")
    paths = [s.path for op in sp.meta.operators for st in op.subtasks if st.keyed_handle
             for _, s in st.keyed_handle.shared if isinstance(s, FileHandle)]
    assert paths
    assert all("/shared/op_AsyncKeyedProcessOperator_b7f87ac19717a4e377100fbc9055ffcf__"
               in p and "__attempt_0/db/" in p for p in paths)


@pytest.mark.parametrize("name", FORST)
def test_forst_on_state_v1_with_local_files_says_rocksdb(name: str) -> None:
    """Nothing in ``_metadata`` or the headers of a ForSt job on State V1 with its primary
    directory local tells ForSt from RocksDB (docs/format-notes.md): state_meta names the layout."""
    assert _open(name).backend == "rocksdb"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """The S3 test server holding the S3 fixture's objects at the keys Flink wrote them to (the
    fixture directory mirrors the bucket under its name)."""
    with moto_s3_server() as server:
        assert server.bucket == "statequery-test"
        server.upload_tree(FIXTURES_ROOT / S3_CHECKPOINT, S3_CHECKPOINT)
        yield server


def _s3_uri(s3: S3Server) -> str:
    chk = fixture_dir(S3_CHECKPOINT)
    return f"s3://{s3.bucket}/{chk.relative_to(FIXTURES_ROOT)}"


def test_s3_checkpoint_names_its_files_on_s3(s3: S3Server) -> None:
    """ForSt's primary directory and the checkpoint directory on S3: ``_metadata`` names every
    table and ForSt file by its absolute s3:// path in the checkpoint's ``shared/``."""
    assert fixture_record(S3_CHECKPOINT)["s3"] is True
    sp = statequery.open(_s3_uri(s3), storage_options=s3.storage_options, use_snapshot=False)
    job = fixture_dir(S3_CHECKPOINT).parent.name
    paths = [s.path for op in sp.meta.operators for st in op.subtasks if st.keyed_handle
             for _, s in (*st.keyed_handle.shared, *st.keyed_handle.private)]
    assert len(paths) == 2 * 9  # six tables, OPTIONS, MANIFEST, CURRENT per subtask
    assert all(p.startswith(f"s3://{s3.bucket}/{S3_CHECKPOINT}/checkpoints/{job}/shared/")
               for p in paths)
    assert sp.backend == "forst"


@pytest.fixture(scope="module")
def s3_cache(tmp_path_factory: pytest.TempPathFactory) -> FileCache:
    """One cache for both decode paths: the first fetches the tables from S3, the second
    decodes the same fetched bytes."""
    return FileCache(tmp_path_factory.mktemp("forst-s3-cache"))


def test_s3_checkpoint_read_from_s3_equals_forst_restore(s3: S3Server, decode_path: str,
                                                         s3_cache: FileCache,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Read through the storage seam from the S3 test server: every entry equals ForSt's own
    restore, and a lookup equals the full read filtered to the key."""
    monkeypatch.setattr(rocks, "_DEFAULT_CACHE", s3_cache)
    sp = statequery.open(_s3_uri(s3), storage_options=s3.storage_options, use_snapshot=False)
    assert savepoint_entries(sp, key_group=True) == sorted(
        canonical(e) for e in dump_entries(S3_CHECKPOINT))
    rows = sp.read("user-state", "amount-by-category").to_pylist()
    got = sp.lookup("user-7", "user-state")
    assert {state: t.to_pylist() for (_, state), t in got.items()}["amount-by-category"] == [
        r for r in rows if r["key"] == "user-7"]
