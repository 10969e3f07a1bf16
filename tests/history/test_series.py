"""The series fixtures read like every other fixture: statequery's entries equal Flink's dump, and
the dump equals the job model (expected/)."""

from __future__ import annotations

import json

import pytest
from support.entries import canonical, savepoint_entries
from support.series import FIXTURES, SEQUENCE, SNAPSHOTS, series_dir, series_dump

import statequery


@pytest.mark.parametrize("snapshot", SNAPSHOTS)
def test_series_snapshot_reads_as_flink_dumps_it(snapshot: str) -> None:
    sp = statequery.open(str(series_dir(snapshot)))
    assert (sp.snapshot_type, sp.format) == (
        ("savepoint", "canonical") if snapshot == "savepoint" else ("checkpoint", "native")
    )
    dumped = sorted(canonical(e) for e in series_dump(snapshot))
    assert savepoint_entries(sp) == dumped
    expected_path = FIXTURES / "expected" / f"{SEQUENCE}-{snapshot}.jsonl"
    expected = sorted(
        canonical(json.loads(line)) for line in expected_path.read_text().splitlines() if line
    )
    assert expected == sorted(
        canonical({k: v for k, v in e.items() if k != "key_group"}) for e in series_dump(snapshot)
    )
