"""The statequery console script: inspect (table and JSON), snapshot, errors -> exit 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from statequery.cli import main
from statequery.metadata.statemeta import SNAPSHOT_FILE_NAME
from tests.conftest import fixture_dir, fixture_record


def _inspect_json(path: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["inspect", path, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_inspect_json_lists_every_state(capsys: pytest.CaptureFixture[str]) -> None:
    rec = fixture_record("datastream-rocksdb-incremental-checkpoint")
    doc = _inspect_json(str(fixture_dir(rec["name"])), capsys)
    assert (doc["snapshot_type"], doc["format"], doc["backend"]) == (
        "checkpoint",
        "native",
        "rocksdb",
    )
    assert {op["operator_id"] for op in doc["operators"]} == {
        op["operator_id"] for op in rec["operators"]
    }
    got = {(s["operator_uid"], s["state_name"]): s["kind"] for s in doc["states"]}
    want = {(op["uid"], s["name"]): s["kind"] for op in rec["operators"] for s in op["states"]}
    assert got == want


def test_inspect_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(fixture_dir("sql-hashmap-canonical"))]) == 0
    out = capsys.readouterr().out
    assert "GroupAggregate[7]" in out and "fully finished" in out
    assert "accState" in out.replace("\n", "") or "accstate" in out


def test_snapshot_command_then_inspect_uses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "sp"
    shutil.copytree(fixture_dir("datastream-hashmap-native"), dst)
    assert main(["snapshot", str(dst)]) == 0
    assert (dst / SNAPSHOT_FILE_NAME).is_file()
    assert "wrote StateMeta snapshot" in capsys.readouterr().out
    doc = _inspect_json(str(dst), capsys)
    assert doc["from_snapshot"] is True and len(doc["states"]) == 15
    out = tmp_path / "elsewhere.msgpack"
    assert main(["snapshot", str(dst / "_metadata"), "--out", str(out)]) == 0
    assert out.is_file() and str(out) in capsys.readouterr().out
    assert _inspect_json(str(dst), capsys)["from_snapshot"] is True
    assert main(["inspect", str(dst), "--json", "--no-snapshot"]) == 0
    assert json.loads(capsys.readouterr().out)["from_snapshot"] is False


def test_errors_exit_1_with_the_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "missing")]) == 1
    assert "no savepoint or checkpoint" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "_metadata").write_bytes(b"\x00" * 64)
    assert main(["inspect", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("statequery: ") and "magic" in err and str(bad / "_metadata") in err
