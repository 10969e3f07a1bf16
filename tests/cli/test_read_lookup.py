"""`statequery read` and `statequery lookup` on the shipped catalog and the fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from statequery.cli import main
from statequery.exceptions import InvalidOptionError
from statequery.keys import parse_key_text
from statequery.serializers.spec import (
    PrimitiveSpec,
    RowDataSpec,
    SqlField,
    SqlType,
    TupleSpec,
)
from tests.conftest import expected_entries, fixture_dir


def _json_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


def test_read_one_key_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(fixture_dir("datastream-rocksdb-native"))
    assert main(["read", path, "user_state__recent_categories", "--key", "user-1", "--json"]) == 0
    rows = _json_lines(capsys)
    want = [e["value"] for e in expected_entries("datastream-rocksdb-native")
            if e["state"] == "recent-categories" and e["key"] == "user-1"]
    assert [r["value"] for r in rows] == want
    assert rows[0]["key_group"] == 121


def test_read_to_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "acc.parquet"
    path = str(fixture_dir("sql-hashmap-canonical"))
    assert main(["read", path, "--operator", "GroupAggregate[7]", "--state", "accState",
                 "--out", str(out)]) == 0
    table = pq.read_table(out)
    assert table.num_rows == 17
    by_word = {r["key"]["f0"]: r["value"] for r in table.to_pylist()}
    assert by_word["w3"]["f0"] == 30 and str(by_word["w3"]["f4"]) == "496.000000"
    assert "wrote 17 rows" in capsys.readouterr().out


def test_lookup_every_state_of_a_key(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(fixture_dir("datastream-hashmap-canonical"))
    assert main(["lookup", path, "user-3", "--json"]) == 0
    rows = _json_lines(capsys)
    states = {r["state"] for r in rows}
    assert {"count", "profile", "recent-categories", "amount-by-category", "window-contents",
            "_timer_state/event_user-timers"} <= states
    assert all(r["key"] == "user-3" and r["key_group"] == 40 for r in rows)
    want = sum(1 for e in expected_entries("datastream-hashmap-canonical")
               if e.get("key") == "user-3")
    assert len(rows) == want


def test_lookup_missing_key_and_bad_table(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(fixture_dir("datastream-hashmap-canonical"))
    assert main(["lookup", path, "nobody"]) == 1
    assert "no state holds key 'nobody'" in capsys.readouterr().err
    assert main(["read", path, "no_such_table"]) == 1
    assert "statequery:" in capsys.readouterr().err


def test_parse_key_text_follows_the_key_type() -> None:
    assert parse_key_text("42", PrimitiveSpec(name="long")) == 42
    assert parse_key_text("42", PrimitiveSpec(name="string")) == "42"
    assert parse_key_text("true", PrimitiveSpec(name="boolean")) is True
    row = RowDataSpec(type=SqlType("ROW", fields=(SqlField("f0", SqlType("VARCHAR")),)))
    assert parse_key_text("w3", row) == {"f0": "w3"}
    pair = TupleSpec(fields=(PrimitiveSpec(name="string"), PrimitiveSpec(name="int")))
    assert parse_key_text('["a", 1]', pair) == {"f0": "a", "f1": 1}
    with pytest.raises(InvalidOptionError, match="2 fields"):
        parse_key_text("a", pair)
    with pytest.raises(InvalidOptionError, match="not a valid INT"):
        parse_key_text("x", PrimitiveSpec(name="int"))
