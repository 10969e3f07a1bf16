"""`statequery versions`, `changes`, `history`, `read`/`lookup --version` (issue 34)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.series import FIXTURES

from statequery.cli import main

SEQUENCE = str(FIXTURES / "sequence-rocksdb-incremental")
JOB_DIR = str(FIXTURES / "sequence-rocksdb-incremental" / "e16e06113d0fe53840ce4fc823ef74d6")


def _lines(out: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_versions_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["versions", SEQUENCE, "--json"]) == 0
    rows = _lines(capsys.readouterr().out)
    assert [(r["checkpoint_id"], r["kind"], r["complete"]) for r in rows] == [
        (1, "checkpoint", True), (2, "checkpoint", True), (3, "checkpoint", True),
        (4, "savepoint", True),
    ]
    assert main(["versions", SEQUENCE]) == 0
    assert "4 versions, 4 complete" in capsys.readouterr().out


def test_changes_window_json_and_out(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["changes", SEQUENCE, "sequence-state", "count", "--start", "2", "--end", "2",
                 "--json"]) == 0
    rows = _lines(capsys.readouterr().out)
    # cycle 1 touches user-3..12: user-10..12 are new keys, user-3..9 counted again
    assert sorted((r["change"], json.loads(r["key"])) for r in rows if r["change"] == "insert") \
        == [("insert", "user-10"), ("insert", "user-11"), ("insert", "user-12")]
    assert sum(r["change"] == "update" for r in rows) == 7
    assert {(r["checkpoint_id"], r["previous_checkpoint_id"]) for r in rows} == {(2, 1)}
    out = tmp_path / "changes.parquet"
    assert main(["changes", SEQUENCE, "--out", str(out)]) == 0
    assert "wrote 222 rows" in capsys.readouterr().out and out.exists()


def test_history_of_a_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", SEQUENCE, "user-3", "--operator", "sequence-state", "--json"]) == 0
    rows = _lines(capsys.readouterr().out)
    counts = [(r["checkpoint_id"], r["value"]) for r in rows if r["state"] == "count"]
    assert counts == [(1, "10"), (2, "20"), (3, "20"), (4, "20")]
    assert main(["history", SEQUENCE, "user-3"]) == 0
    assert "entries in 4 of 4 versions" in capsys.readouterr().out


def test_read_and_lookup_a_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["read", JOB_DIR, "--operator", "sequence-state", "--state", "count",
                 "--key", "user-3", "--version", "1", "--json"]) == 0
    assert [r["value"] for r in _lines(capsys.readouterr().out)] == [10]
    assert main(["lookup", SEQUENCE, "user-12", "--version", "1", "--json"]) == 1
    assert "no state holds key 'user-12'" in capsys.readouterr().err  # first in version 2
    assert main(["lookup", SEQUENCE, "user-12", "--version", "2", "--json"]) == 0
    assert capsys.readouterr().out.strip()


def test_history_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["history", str(tmp_path), "user-3"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("statequery: no checkpoint or savepoint under") and "Traceback" not in err
    assert main(["read", SEQUENCE, "--operator", "sequence-state", "--state", "count",
                 "--version", "9"]) == 1
    assert "no version 9" in capsys.readouterr().err
    assert main(["changes", SEQUENCE, "--start", "3", "--end", "1"]) == 1
    assert "after end" in capsys.readouterr().err
