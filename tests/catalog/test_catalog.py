"""The default catalog: a folder of real savepoints, one database each."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import statequery
from statequery.catalog import DEFAULT_CATALOG, Catalog, sql_identifier
from statequery.exceptions import NoSuchTableError, SavepointNotFoundError
from tests.conftest import fixture_dir


def test_default_catalog_lists_the_shipped_savepoints() -> None:
    catalog = Catalog()
    assert Path(DEFAULT_CATALOG).name == "catalog"
    assert catalog.databases() == ["user_activity", "user_activity_rocksdb", "word_counts"]


def test_tables_are_state_meta_one_per_state_and_operator_tables() -> None:
    catalog = Catalog()
    tables = catalog.tables("user_activity")
    assert tables[0] == "state_meta"
    assert "user_state__count" in tables
    assert "window_agg__window_contents" in tables
    assert "operator_state__union_markers" in tables
    # the two operators with several keyed states have an operator table
    assert tables[-2:] == ["window_agg", "user_state"]
    assert len(tables) == len(set(tables)) == 1 + 15 + 2


def test_resolve_by_table_name_and_by_uid_spelling() -> None:
    catalog = Catalog()
    row = catalog.resolve("user_activity", "user_state__recent_categories")
    assert (row["operator_uid"], row["state_name"], row["kind"]) == (
        "user-state", "recent-categories", "list")
    # the same table named through the operator id and the state name
    again = catalog.resolve("user_activity", f"{row['operator_id']}__recent-categories")
    assert again["table_name"] == row["table_name"]
    with pytest.raises(NoSuchTableError, match="no table 'nope'"):
        catalog.resolve("user_activity", "nope")


def test_sql_database_holds_the_group_aggregate_state() -> None:
    meta = Catalog().savepoint("word_counts").state_meta().to_pylist()
    by_state = {r["state_name"]: r for r in meta}
    assert by_state["accState"]["kind"] == "value"
    assert by_state["distinctAcc_0"]["kind"] == "map"
    assert by_state["accState"]["operator_name"] == "GroupAggregate[7]"


def test_unknown_database_names_the_ones_there() -> None:
    with pytest.raises(SavepointNotFoundError, match="user_activity"):
        Catalog().savepoint("no_such_db")


def test_folder_with_one_savepoint_opens_and_two_are_ambiguous(tmp_path: Path) -> None:
    one = tmp_path / "one"
    one.mkdir()
    first = one / "savepoint-aaaaaa-000000000000"
    shutil.copytree(fixture_dir("datastream-hashmap-canonical"), first)
    assert statequery.open(str(one)).checkpoint_id >= 1
    shutil.copytree(fixture_dir("datastream-hashmap-inline"), one / "savepoint-bbbbbb-000000000000")
    with pytest.raises(SavepointNotFoundError, match="several savepoints"):
        statequery.open(str(one))


def test_checkpoint_database_resolves_to_highest_chk(tmp_path: Path) -> None:
    src = fixture_dir("datastream-hashmap-checkpoint").parent  # <job-id>/
    dest = tmp_path / "db" / src.name
    shutil.copytree(src, dest)
    catalog = Catalog(str(tmp_path))
    assert catalog.databases() == ["db"]
    assert catalog.location("db").endswith("chk-1")


def test_sql_identifier() -> None:
    assert sql_identifier("_timer_state/event_user-timers") == "timer_state_event_user_timers"
    assert sql_identifier("GroupAggregate[7]") == "groupaggregate_7"
    assert sql_identifier("7up") == "_7up"
