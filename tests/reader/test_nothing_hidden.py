"""No state that Flink's own restore finds is missing from ``state_meta`` (issue 26).

For every fixture with an oracle dump (the matrix, the other Flink versions, the changelog
checkpoints; docs/fixtures.md), each ``(operator id, state)`` the dump holds an entry of must be
a row of statequery's ``state_meta`` -- listed, whether or not statequery can decode it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIXTURES, load_manifest

import statequery


def _records() -> list[tuple[str, str]]:
    m = load_manifest()
    return [(r["name"], r["path"]) for r in m["fixtures"] + m.get("changelog", [])
            if (FIXTURES / "dump" / f"{r['name']}.jsonl").is_file()]


@pytest.mark.parametrize(("name", "path"), _records())
def test_every_state_of_the_oracle_is_listed(name: str, path: str) -> None:
    dumped = set()
    for line in Path(FIXTURES / "dump" / f"{name}.jsonl").read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            dumped.add((e["operator_id"], e["state"]))
    rows = statequery.open(str(FIXTURES / path), use_snapshot=False).state_meta().to_pylist()
    listed = {(r["operator_id"], r["state_name"]) for r in rows}
    assert dumped, name
    assert not dumped - listed, f"{name}: states Flink restores but state_meta lacks: " + str(
        sorted(dumped - listed))
