"""The edge-value fixtures (docs/fixtures.md, "The edge-value jobs") on both decode paths.

Every ``edge-*`` fixture of the manifest -- DataStream and SQL, hashmap and RocksDB, canonical and
native savepoints, retained checkpoints (RocksDB full and incremental) -- is read completely on
the compiled and on the pure-Python path and must equal Flink's own dump (``dump/<name>.jsonl``,
with ``key_group``) entry by entry, and hold the model's entries (``expected/<name>.jsonl``: all
of them, or a subset when the manifest says ``"expected": "subset"``).

Each read runs in a child process: a crash of a decoder (segfault, abort) is this test's failure,
with the state being read named, rather than the end of the test run. The child reads state by
state and reports a state that raises as an ``{"$error": ...}`` line, so one failing state does
not hide the others. test_reader.py and backends/test_fastpath.py pick these fixtures up too
(in process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import dump_entries, expected_entries, fixture_dir, fixture_record, fixture_records
from entries import canonical, mask_any

from statequery.backends import fastpath

TESTS = Path(__file__).parent
REPO = TESTS.parent
EDGE = [r["name"] for r in fixture_records() if r["job"].startswith("edge-")]
SHOW = 10

# Prints one line per entry (sorted), and one {"$error": ...} line per state that failed to read.
# "$reading" lines on stderr name the state being read, for a crash report.
_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
import statequery
from entries import canonical, state_entries
from statequery.io import FileIO
from statequery.reader import list_states, read_table

sp = statequery.open(sys.argv[1], io=FileIO(), use_snapshot=False)
lines = []
for op in sp.metadata.operators:
    for ref in list_states(sp, op):
        print("$reading", op.uid or op.name, ref.name, file=sys.stderr, flush=True)
        try:
            table = read_table(sp, op, ref.name)
        except Exception as e:
            lines.append(canonical({"$error": f"{op.uid or op.name} / {ref.name}: "
                                              f"{type(e).__name__}: {e}"[:500]}))
            continue
        lines.extend(canonical(e) for e in state_entries(
            table, ref.kind, ref.name, op.uid or "", op.operator_id, True))
sys.stdout.write("".join(line + "\n" for line in sorted(lines)))
"""


def _read_in_child(name: str, pure: bool) -> tuple[list[str], str]:
    env = dict(os.environ)
    env.pop(fastpath.PURE_ENV, None)
    if pure:
        env[fastpath.PURE_ENV] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _CHILD, str(fixture_dir(name)), str(TESTS)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    if proc.returncode != 0:
        reading = [x for x in proc.stderr.splitlines() if x.startswith("$reading")]
        where = reading[-1][len("$reading "):] if reading else "?"
        pytest.fail(
            f"{name}: the reader process died (exit {proc.returncode}) while reading {where}\n"
            + "\n".join(proc.stderr.splitlines()[-15:]),
            pytrace=False,
        )
    return proc.stdout.splitlines(), proc.stderr


def _differences(mine: list[str], theirs: list[str]) -> str:
    a, b = Counter(mine), Counter(theirs)
    only_mine = sorted((a - b).elements())
    only_theirs = sorted((b - a).elements())
    per_state: Counter[str] = Counter()
    for line in only_mine + only_theirs:
        e = json.loads(line)
        per_state[e.get("$error", "").split(":")[0] or f"{e['operator_uid']} / {e['state']}"] += 1
    return (
        f"{len(only_mine)} entries only in statequery, {len(only_theirs)} only in Flink's dump; "
        f"per state: {dict(per_state)}\n"
        + "\n".join("  statequery: " + x[:300] for x in only_mine[:SHOW])
        + "\n"
        + "\n".join("  dump:       " + x[:300] for x in only_theirs[:SHOW])
    )


def test_the_edge_fixtures_are_in_the_manifest() -> None:
    jobs = Counter(fixture_record(n)["job"] for n in EDGE)
    assert jobs == {"edge-datastream": 7, "edge-sql": 7}, jobs
    for name in EDGE:
        record = fixture_record(name)
        assert record["max_parallelism"] in (96, 300)  # not powers of two


@pytest.mark.parametrize("path", ["compiled", "pure"])
@pytest.mark.parametrize("name", EDGE)
def test_edge_fixture_equals_flink_dump(name: str, path: str) -> None:
    if path == "compiled" and fastpath.compiled() is None:
        assert os.environ.get("STATEQUERY_NO_EXTENSIONS"), "statequery.backends._read not built"
    mine, _ = _read_in_child(name, pure=path == "pure")
    dump = sorted(canonical(e) for e in dump_entries(name))
    assert mine == dump, f"{name} [{path}]: " + _differences(mine, dump)

    want = expected_entries(name)
    got = [json.loads(x) for x in mine]
    for e in got:
        e.pop("key_group", None)
    got_lines = Counter(canonical(e) for e in mask_any(got, want))
    expected = Counter(canonical(e) for e in want)
    assert expected
    if fixture_record(name).get("expected") == "subset":
        missing = sorted((expected - got_lines).elements())
        assert not missing, f"{name} [{path}]: expected entries not read: {missing[:SHOW]}"
    else:
        assert got_lines == expected, f"{name} [{path}]: " + _differences(
            sorted(got_lines.elements()), sorted(expected.elements()))


def _values(name: str, uid: str, state: str) -> list[Any]:
    return [e for e in dump_entries(name) if e["operator_uid"] == uid and e["state"] == state]


def test_the_edge_values_are_in_the_oracle() -> None:
    """The dump holds what the fixtures are for (so a regenerated fixture cannot lose them)."""
    name = "edge-datastream-hashmap-canonical"
    keys = {e["key"] for e in _values(name, "edge-state", "str")}
    assert {"", "\u0000", "a\u0000b\u0000", "\U0001D11E", "东京", "Ω≈ç√", "😀🎉👍🏽"} <= keys
    assert max(len(k) for k in keys) > 65535  # beyond writeUTF's limit
    floats = {json.dumps(e["user_key"]) for e in _values(name, "edge-state", "float-to-bool")}
    assert {'"NaN"', '"Infinity"', '"-Infinity"', "-0.0", "0.0", "1.401298464324817e-45"} <= floats
    longs = {e["user_key"] for e in _values(name, "edge-state", "long-to-double")}
    assert longs == {-(2**63), 2**63 - 1, 0, -1}
    pojo = [e["value"] for e in _values(name, "edge-state", "pojo")]
    assert any(p["iBox"] is None and p["str"] is None for p in pojo)
    windows = _values(name, "edge-tumble", "window-contents")
    assert {"f0": "", "f1": -(2**31)} in [e["key"] for e in windows]
    assert min(e["namespace"]["start"] for e in windows) == -62135596800000
    sql = dump_entries("edge-sql-hashmap-canonical")
    assert {"f0": ""} in [e["key"] for e in sql if e["state"] == "accState"]
