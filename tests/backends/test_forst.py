"""ForSt (``state.backend.type: forst``, Flink 2.x): what its snapshots hold.

ForSt is a fork of RocksDB and writes RocksDB's files and handles: statequery reads them as it
reads RocksDB's (the fixtures ``datastream-forst-native`` and ``datastream-forst-checkpoint`` are
in every fixture suite, against a dump made by ForSt's own restore, ``SavepointDump
--backend=forst``). What differs is its defaults: partitioned (two-level) indexes and filters,
which the table reader's lookups walk (``tests/backends/test_rocksdb_tables.py``).
"""

from __future__ import annotations

import pytest
from conftest import fixture_dir, fixture_record

import statequery
from statequery.backends.sst import SstFile

FORST = ["datastream-forst-native", "datastream-forst-checkpoint"]


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
