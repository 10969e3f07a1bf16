"""Snapshots whose keyed state statequery cannot read yet are listed with the reason, never
dropped (the manifest's ``unread`` list, docs/fixtures.md).

``changelog-hashmap-unmaterialized-checkpoint``: Flink 2.3 with the changelog state backend
(``state.changelog.enabled``, file-system changelog storage, materialization every hour), a
retained checkpoint taken before the first materialization: each keyed subtask holds a
``ChangelogStateBackendHandle`` with no materialized base, only change-log handles. No state-file
header names its states, so statequery cannot list them by name: each keyed operator gets one
``(keyed state)`` row saying so, and its operator state reads as usual.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, load_manifest
from entries import canonical, state_entries

import statequery
from statequery.cli import main
from statequery.exceptions import UnsupportedFormatError

NAME = "changelog-hashmap-unmaterialized-checkpoint"


def _record(name: str) -> dict[str, Any]:
    return next(r for r in load_manifest()["unread"] if r["name"] == name)


def _dir(name: str) -> Path:
    return FIXTURES / _record(name)["path"]


def test_changelog_keyed_state_is_listed_with_its_reason() -> None:
    assert _record(NAME)["changelog"] == "1h"
    sp = statequery.open(str(_dir(NAME)), use_snapshot=False)
    rows = sp.state_meta().to_pylist()
    keyed = [r for r in rows if r["operator_uid"] in ("user-state", "window-agg")]
    # one row per keyed operator, none of the 11 keyed states invented or silently missing
    assert sorted((r["operator_uid"], r["state_name"], r["kind"]) for r in keyed) == [
        ("user-state", "(keyed state)", "raw"),
        ("window-agg", "(keyed state)", "raw"),
    ]
    for r in keyed:
        assert not r["decodable"]
        assert "change log" in r["reason"] and "materialization" in r["reason"]
        assert r["size_bytes"] > 0
    with pytest.raises(UnsupportedFormatError, match="change log"):
        sp.read("user-state", "(keyed state)")


def test_operator_state_beside_the_change_log_reads_as_the_job_wrote_it() -> None:
    sp = statequery.open(str(_dir(NAME)), use_snapshot=False)
    want = sorted(
        canonical({k: v for k, v in e.items() if k != "operator_id"})
        for e in map(json.loads, (FIXTURES / "expected" / f"{NAME}.jsonl").read_text().splitlines())
        if e["operator_uid"] in ("fixture-source", "operator-state")
    )
    got = []
    for op in sp.operators:
        for s in op.states:
            if s.kind in ("operator_list", "operator_union", "broadcast"):
                table = sp.read(s)
                got += [canonical({k: v for k, v in e.items() if k != "operator_id"})
                        for e in state_entries(table, s.kind, s.name, op.uid, op.operator_id,
                                               False)]
    assert want and sorted(got) == want


def test_inspect_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(_dir(NAME)), "--json"]) == 0
    out = capsys.readouterr().out
    assert "change log" in out and "(keyed state)" in out
