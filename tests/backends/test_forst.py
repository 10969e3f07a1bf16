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
from typing import Any

import pytest
from conftest import dump_entries, expected_entries, fixture_dir, fixture_record
from entries import canonical, mask_any, savepoint_entries

import statequery
from statequery.backends.sst import SstFile
from statequery.metadata.handles import FileHandle

FORST = ["datastream-forst-native", "datastream-forst-checkpoint"]
ASYNC = ["async-datastream-forst-checkpoint", "async-datastream-forst-native",
         "async-sql-forst-native"]


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
