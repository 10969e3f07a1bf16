"""The real incremental RocksDB checkpoint with its ``_metadata`` edited so that shared-file
handles name other places (metadata/test_trust.py, io/test_confinement.py,
io/test_fetch_confinement.py)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from conftest import fixture_dir

import statequery
from statequery.io import FileIO

FIXTURE = "datastream-rocksdb-incremental-checkpoint"


def edited_copy(tmp_path: Path, rewrite: Callable[[str], str]) -> Path:
    """A private copy of the checkpoint whose absolute handle paths are ``rewrite(path)``;
    returns the ``chk-1`` directory."""
    chk = fixture_dir(FIXTURE)
    job = chk.parent
    shutil.copytree(job, tmp_path / job.name)
    meta = tmp_path / job.name / chk.name / "_metadata"
    data = meta.read_bytes()
    out, pos = bytearray(), 0
    for m in re.finditer(rb"file:/[!-~]+", data):
        n = int.from_bytes(data[m.start() - 2 : m.start()], "big")
        old = data[m.start() : m.start() + n].decode()
        new = rewrite(old).encode()
        out += data[pos : m.start() - 2] + len(new).to_bytes(2, "big") + new
        pos = m.start() + n
    out += data[pos:]
    meta.write_bytes(bytes(out))
    return meta.parent


def read_everything(location: Path, io: FileIO | None = None) -> int:
    """Every row of every state of the savepoint at ``location`` (a count)."""
    sp = statequery.open(str(location), io=io or FileIO(), use_snapshot=False)
    return sum(sp.read(t).num_rows for t in sp.state_meta().column("table_name").to_pylist())
