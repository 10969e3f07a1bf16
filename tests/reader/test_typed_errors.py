"""Hostile or unusual values end in rows or typed errors, never in Python's own exceptions.

``Long.MAX_VALUE`` timers are real (Flink registers them for "end of input" and global windows):
they must read, in every front end. The savepoint here is a real fixture whose state file has one
timer's 8 bytes set to ``Long.MAX_VALUE`` (``TimerSerializer`` stores
``timestamp - Long.MIN_VALUE``, so ``ff..ff``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import statequery
from statequery.catalog import Catalog
from statequery.cli import main
from statequery.exceptions import MissingExtraError, StatequeryError
from tests.conftest import fixture_dir

LONG_MAX = 2**63 - 1
TIMER_2100 = bytes.fromhex("800003bb2cc3")  # the fixture's user timers, 2100-01-01 + a few ms
STATE = "user_state__timer_state_event_user_timers"


@pytest.fixture(scope="module")
def max_timer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog folder holding one database, ``sp``: the canonical fixture, one user timer set
    to ``Long.MAX_VALUE``."""
    root = tmp_path_factory.mktemp("maxtimer")
    src = fixture_dir("datastream-hashmap-canonical")
    shutil.copytree(src, root / "sp")
    [state_file] = [p for p in (root / "sp").iterdir()
                    if p.is_file() and TIMER_2100 in p.read_bytes()
                    and p.read_bytes().count(TIMER_2100) > 20]
    data = bytearray(state_file.read_bytes())
    at = data.index(TIMER_2100)
    data[at : at + 8] = b"\xff" * 8
    state_file.write_bytes(bytes(data))
    return root


def test_long_max_value_timer_reads(max_timer: Path) -> None:
    before = statequery.open(str(fixture_dir("datastream-hashmap-canonical"))).read(STATE)
    t = statequery.open(str(max_timer / "sp")).read(STATE)
    assert t.num_rows == before.num_rows
    rows = t.to_pylist()  # no OverflowError: the instant is null, the long is exact
    [maxed] = [r for r in rows if r["timestamp_ms"] == LONG_MAX]
    assert maxed["timestamp"] is None
    others = sorted(r["timestamp_ms"] for r in rows if r is not maxed)
    old = sorted(before.column("timestamp_ms").to_pylist())
    assert len(others) == len(old) - 1 and set(others) <= set(old)
    for r in rows:
        if r is not maxed:
            assert int(r["timestamp"].timestamp() * 1000) == r["timestamp_ms"]
    # the key's lookup and the timestamp column's own type are unchanged
    key = maxed["key"]
    found = statequery.open(str(max_timer / "sp")).lookup(key)
    assert LONG_MAX in [
        v for table in found.values() if "timestamp_ms" in table.column_names
        for v in table.column("timestamp_ms").to_pylist()
    ]


def test_long_max_value_timer_in_cli_and_sql(
    max_timer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sp = str(max_timer / "sp")
    assert main(["read", sp, STATE, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert [r["timestamp"] for r in rows if r["timestamp_ms"] == LONG_MAX] == [None]
    assert main(["read", sp, STATE]) == 0
    assert str(LONG_MAX) in capsys.readouterr().out
    key = next(r["key"] for r in rows if r["timestamp_ms"] == LONG_MAX)
    assert main(["lookup", sp, key, "--json"]) == 0
    assert str(LONG_MAX) in capsys.readouterr().out
    t = statequery.sql(
        f"SELECT key, timestamp_ms FROM sp.{STATE} WHERE timestamp IS NULL", Catalog(str(max_timer))
    )
    assert t.to_pylist() == [{"key": key, "timestamp_ms": LONG_MAX}]


def test_python_rows_gives_out_of_range_instants_as_integers() -> None:
    import pyarrow as pa

    from statequery.arrow import python_rows

    ts = pa.timestamp("us")
    t = pa.table({
        "a": pa.array([1, 2**62], pa.timestamp("ms", tz="UTC")),
        "s": pa.array([{"t": 5, "n": 1}, {"t": 7, "n": 2}],
                      pa.struct([("t", ts), ("n", pa.int8())])),
    })
    with pytest.raises((OverflowError, ValueError)):
        t.to_pylist()
    rows = python_rows(t)
    assert [r["a"] for r in rows] == [1, 2**62]
    assert rows[1]["s"]["n"] == 2 and rows[1]["s"]["t"].microsecond == 7


@pytest.mark.parametrize(
    "location",
    [
        "nosuchscheme://bucket/savepoint",
        "/tmp/a\x00b/savepoint",
        "file:///tmp/\x00/_metadata",
    ],
)
def test_odd_locations_are_typed_errors(location: str) -> None:
    with pytest.raises(StatequeryError):
        statequery.open(location)
    assert main(["inspect", location]) == 1


def test_missing_filesystem_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # import gcsfs raises ImportError
    with pytest.raises(MissingExtraError, match=r"statequery\[gcs\]") as info:
        statequery.open("gs://bucket/savepoint")
    assert isinstance(info.value, StatequeryError) and not isinstance(info.value, ImportError)
