"""``statequery export``: every state of an operator to files in one pass, equal to reading
each state alone; atomic; one-line errors."""

from __future__ import annotations

import os

import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from conftest import fixture_dir

import statequery
from statequery.cli import main


@pytest.mark.parametrize("name", ["datastream-hashmap-canonical", "datastream-rocksdb-native"])
def test_export_writes_every_state_equal_to_read(
    name: str, tmp_path, capsys: pytest.CaptureFixture[str]  # type: ignore[no-untyped-def]
) -> None:
    path = str(fixture_dir(name))
    out = tmp_path / "user-state"
    assert main(["export", path, "user-state", "--out", str(out)]) == 0
    sp = statequery.open(path)
    states = sp.operator_states("user-state")
    assert sorted(os.listdir(out)) == sorted(f"{s.table_name}.parquet" for s in states)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(states)
    for s in states:
        got = pq.read_table(out / f"{s.table_name}.parquet")
        want = sp.read(s)
        assert got.to_pylist() == want.to_pylist(), s.name
        assert f"wrote {want.num_rows} rows to {out / (s.table_name + '.parquet')}" in printed


def test_export_one_key_arrow_and_csv(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(fixture_dir("datastream-hashmap-canonical"))
    sp = statequery.open(path)
    arrow_dir = tmp_path / "a"
    args = ["export", path, "user-state", "--key", "user-3", "--format", "arrow",
            "--state", "count", "--state", "user_state__amount_by_category", "--out"]
    assert main([*args, str(arrow_dir)]) == 0
    assert sorted(os.listdir(arrow_dir)) == [
        "user_state__amount_by_category.arrow", "user_state__count.arrow"
    ]
    count = feather.read_table(arrow_dir / "user_state__count.arrow")
    assert count.to_pylist() == sp.read("user-state", "count", key="user-3").to_pylist()
    assert count.num_rows == 1
    by_cat = feather.read_table(arrow_dir / "user_state__amount_by_category.arrow")
    assert by_cat.num_rows == 4 and set(by_cat.column("key").to_pylist()) == {"user-3"}
    csv_dir = tmp_path / "c"
    assert main(["export", path, "user-state", "--format", "csv", "--state", "profile",
                 "--out", str(csv_dir)]) == 0
    profile = pacsv.read_csv(csv_dir / "user_state__profile.csv")
    assert profile.num_rows == 20
    assert "value.address.city" in profile.column_names  # structs flattened as in read --out


def test_export_errors_leave_nothing_behind(
    tmp_path, capsys: pytest.CaptureFixture[str]  # type: ignore[no-untyped-def]
) -> None:
    path = str(fixture_dir("datastream-hashmap-canonical"))
    target = tmp_path / "x"
    assert main(["export", path, "user-state", "--state", "nope", "--out", str(target)]) == 1
    err = capsys.readouterr().err
    assert "no state 'nope'" in err and "Traceback" not in err
    assert not target.exists()  # planned first: nothing created
    assert main(["export", path, "user-state", "--out", str(tmp_path / "no" / "such")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["export", path, "operator-state", "--key", "k", "--out", str(target)]) == 1
    assert "has no readable keyed state" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
