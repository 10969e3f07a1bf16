"""Hostile pickles behind ``pickled=True`` (issue 31 item 4; the attacks:
tests/support/pickle_attacks.py).

Each attack ends in a typed reason on that one value (``<column>_py_reason``), the other values
of the table decoded, in bounded memory. The attacks that crashed (a segmentation fault while
hashing a deep tuple) or ate gigabytes (a memo index, shared text rendered once per reference)
run in a subprocess whose peak RSS is measured (``getrusage(RUSAGE_CHILDREN)`` in a wrapper), so
that on the old code the test fails instead of killing the run.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import fixture_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from support import pickle_attacks as attacks

from statequery.pickled import MAX_DEPTH, Refused, add_python_columns, loads, render

REPO = Path(__file__).resolve().parents[2]
RSS_CAP_KIB = 512 * 1024
GOOD = pickle.dumps({"a": [1, 2], "s": "é"}, 4)
GOOD_JSON = '{"a":[1,2],"s":"é"}'

#: runs a command (argv after the script's own) with stdout and stderr to files, and prints
#: its exit status and the peak RSS of the child (KiB) as JSON
_MEASURE = """
import json, resource, subprocess, sys
out, err = sys.argv[1], sys.argv[2]
with open(out, "wb") as o, open(err, "wb") as e:
    rc = subprocess.run(sys.argv[3:], stdout=o, stderr=e, timeout=300).returncode
print(json.dumps({"rc": rc,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

#: the pickled columns of a three-row table whose middle value is an attack
_COLUMNS = """
import json, pickle, sys
import pyarrow as pa
from tests.support import pickle_attacks
from statequery.pickled import add_python_columns
good = pickle.dumps({"a": [1, 2], "s": "\\u00e9"}, 4)
data = pickle_attacks.ATTACKS[sys.argv[1]]()
t = add_python_columns(pa.table({"value": pa.array([good, data, good], pa.binary())}))
print(json.dumps(t.select(["value_py", "value_py_reason"]).to_pylist()))
"""


def _measured(tmp_path: Path, argv: list[str]) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, peak RSS in KiB) of ``argv`` run in a child."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = subprocess.run([sys.executable, "-c", _MEASURE, str(out), str(err), *argv],
                         capture_output=True, text=True, timeout=600, env=env, check=True)
    report = json.loads(got.stdout)
    return (report["rc"], out.read_text("utf-8", "replace"), err.read_text("utf-8", "replace"),
            report["maxrss_kib"])


@pytest.mark.parametrize(("attack", "reason"), [
    ("deep_tuple_key", f"the pickle nests deeper than {MAX_DEPTH}"),  # before: SIGSEGV
    ("deep_tuple_in_frozenset", f"the pickle nests deeper than {MAX_DEPTH}"),  # before: SIGSEGV
    ("memo_index", None),  # before: 2.1 GB, decoded: None at memo index 2**27 (a dict entry)
    ("shared_text", "too large to render: more than"),  # before: 10**9 characters, 1.96 GB
    ("tuple_dag_key", "take too long to hash"),  # before: a hash of 2**25 tuples
])
def test_an_attack_is_a_reason_on_its_value_alone(tmp_path: Path, attack: str,
                                                  reason: str | None) -> None:
    rc, out, err, peak = _measured(
        tmp_path, [sys.executable, "-c", _COLUMNS, attack])
    assert rc == 0, (rc, err[-2000:])
    rows = json.loads(out)
    assert [r["value_py"] for r in rows[::2]] == [GOOD_JSON, GOOD_JSON]
    assert [r["value_py_reason"] for r in rows[::2]] == [None, None]
    if reason is None:
        assert rows[1] == {"value_py": "null", "value_py_reason": None}
    else:
        assert rows[1]["value_py"] is None and reason in rows[1]["value_py_reason"], rows[1]
    assert peak < RSS_CAP_KIB, f"peak RSS {peak} KiB"


@pytest.mark.parametrize(("attack", "reason"), [
    ("colliding_keys", "more than 32 keys of one dict or set with one hash value"),
    ("build_on_row", "the pickle sets an object's state (BUILD): not plain data"),
    ("deep_list", f"the pickle nests deeper than {MAX_DEPTH}"),
    ("many_values", "the pickle holds more than 1000000 values"),
    ("huge_bytearray", "a bytearray of 1099511627776 bytes in a pickle of 12"),
    ("many_memo_entries", "the pickle memoizes more than 1000000 values"),
    ("open_marks", f"the pickle nests deeper than {MAX_DEPTH} (MARKs)"),
])
def test_bounded_attacks_are_refused_when_decoded(attack: str, reason: str) -> None:
    """Before: a dict of colliding keys (quadratic), a structure deeper than the renderer goes,
    a list of 1.2 million values, 1.2 million memo entries and 200 open MARKs were decoded;
    BUILD set a Row's fields to an int and the renderer's TypeError broke the whole table
    (add_python_columns raised)."""
    data = attacks.ATTACKS[attack]()
    got = loads(data)
    assert isinstance(got, Refused) and reason in got.reason, got
    t = add_python_columns(pa.table({"value": pa.array([GOOD, data, GOOD], pa.binary())}))
    assert t.column("value_py").to_pylist() == [GOOD_JSON, None, GOOD_JSON]
    assert t.column("value").to_pylist()[1] == data  # the raw bytes stay
    assert reason in t.column("value_py_reason").to_pylist()[1]


def test_the_render_budget_follows_the_pickle_size() -> None:
    """The JSON text of a value is bounded in characters, not only in values: before, the cap
    counted 100,000 values however long each one's text."""
    shared = "x" * 10_000
    data = pickle.dumps([shared] * 100)  # 10 KB of pickle, 1,000,000 characters of JSON
    assert render(loads(data))[0] is not None  # within the 8 MiB cap when asked directly
    t = add_python_columns(pa.table({"value": pa.array([data], pa.binary())}))
    assert t.column("value_py").to_pylist() == [None]
    assert t.column("value_py_reason").to_pylist() == [
        f"too large to render: more than {4096 + 64 * len(data)} characters of JSON"]
    text, reason = render(loads(data), max_chars=400_000)
    assert text is None and reason == "too large to render: more than 400000 characters of JSON"


# -- end to end: a PyFlink savepoint whose one value is an attack --------------------------------


def _savepoint_with(tmp_path: Path, attack: bytes) -> Path:
    """A copy of pyflink-thread-hashmap-canonical (as catalog/pyt) whose py-typed/blob value of
    user-4 (the last key group of its state file, so that no other offset moves) is ``attack``:
    the two lengths before it and the file's size in _metadata are rewritten."""
    src = fixture_dir("pyflink-thread-hashmap-canonical")
    sp_dir = tmp_path / "catalog" / "pyt"
    shutil.copytree(src, sp_dir)
    name = "e5221c32-9d81-4f56-8e73-51985572ca82"
    state_file = sp_dir / name
    data = state_file.read_bytes()
    old = _raw_user4(sp_dir)
    at = data.index(old, 11488)  # key group 121's offset in _metadata
    # PyFlink's byte[] (int length + the pickle) inside the state's value bytes (int length)
    assert int.from_bytes(data[at - 4:at], "big") == len(old)
    assert int.from_bytes(data[at - 8:at - 4], "big") == len(old) + 4
    new = (data[:at - 8] + (len(attack) + 4).to_bytes(4, "big") + len(attack).to_bytes(4, "big")
           + attack + data[at + len(old):])
    state_file.write_bytes(new)
    meta = sp_dir / "_metadata"
    mdata = meta.read_bytes()
    size_at = mdata.index(name.encode()) + len(name)
    assert int.from_bytes(mdata[size_at:size_at + 8], "big") == len(data)
    meta.write_bytes(mdata[:size_at] + len(new).to_bytes(8, "big") + mdata[size_at + 8:])
    return sp_dir


def _raw_user4(sp_dir: Path) -> bytes:
    import statequery

    rows = statequery.open(str(sp_dir), use_snapshot=False).read("py-typed", "blob").to_pylist()
    return bytes(next(r["value"] for r in rows if r["key"]["f0"] == "user-4"))


def _expected_rows() -> dict[str, Any]:
    import statequery

    sp = statequery.open(str(fixture_dir("pyflink-thread-hashmap-canonical")),
                         use_snapshot=False)
    return {r["key"]["f0"]: (r["value_py"], r["value_py_reason"])
            for r in sp.read("py-typed", "blob", pickled=True).to_pylist()}


@pytest.mark.parametrize(("attack", "front", "reason"), [
    ("deep_tuple_key", "read", "nests deeper than"),  # before: SIGSEGV
    ("deep_tuple_key", "sql", "nests deeper than"),  # before: SIGSEGV
    ("memo_index", "sql", None),  # before: 2.27 GB with --memory-limit 256MiB, 27.7 s
    ("shared_text", "read", "too large to render"),  # before: 1.96 GB
])
def test_a_savepoint_with_an_attack_value(tmp_path: Path, attack: str, front: str,
                                          reason: str | None) -> None:
    sp_dir = _savepoint_with(tmp_path, attacks.ATTACKS[attack]())
    exe = [sys.executable, "-m", "statequery.cli"]
    if front == "read":
        argv = [*exe, "read", str(sp_dir), "py_typed__blob", "--json", "--pickled"]
    else:
        argv = [*exe, "sql", "SELECT key.f0 AS u, value_py, value_py_reason "
                "FROM pyt.py_typed__blob ORDER BY u", "--catalog", str(tmp_path / "catalog"),
                "--json", "--pickled", "--memory-limit", "256MiB", "--timeout", "5"]
    rc, out, err, peak = _measured(tmp_path, argv)
    assert rc == 0, (rc, err[-2000:])
    rows = {}
    for line in out.splitlines():
        r = json.loads(line)
        user = r["u"] if "u" in r else r["key"]["f0"]
        rows[user] = (r["value_py"], r["value_py_reason"])
    want = _expected_rows()
    assert set(rows) == set(want)
    for user, got in rows.items():
        if user != "user-4":
            assert got == want[user], user  # the other rows: decoded as before
    if reason is None:
        assert rows["user-4"] == ("null", None)
    else:
        assert rows["user-4"][0] is None and reason in rows["user-4"][1]
    assert peak < RSS_CAP_KIB, f"peak RSS {peak} KiB"


def test_the_table_view_of_a_savepoint_with_an_attack_value(tmp_path: Path) -> None:
    """The default table view renders the pickles too: one value a deep dict key."""
    sp_dir = _savepoint_with(tmp_path, attacks.deep_tuple_key())
    rc, out, err, peak = _measured(
        tmp_path, [sys.executable, "-m", "statequery.cli", "read", str(sp_dir),
                   "py_typed__blob"])
    assert rc == 0, (rc, err[-2000:])
    assert "nests deeper" in out and '"name":"user-2"' in out.replace(" ", "")
    assert peak < RSS_CAP_KIB


# -- fuzz: streams of hostile pieces ---------------------------------------------------------------

_ROW = b"\x8c\x14pyflink.common.types\x8c\x0b_create_row\x93N)\x86R"
_PIECES = [
    b"(", b"}", b"]", b")", b"\x8f", b"\x85", b"\x86", b"\x87", b"2", b"0", b"1", b"s", b"u",
    b"a", b"e", b"\x90", b"\x91", b"d", b"l", b"t", b"\x94", b"q\x00", b"h\x00", b"h\x01",
    b"N", b"K\x01", b"K\x02", b"\x8c\x01a", b"\x88", b"R", b"b", b"\x81", _ROW,
    b"\x8c\x08builtins\x8c\x03set\x93", b"\x8c\x08builtins\x8c\tfrozenset\x93",
    b"\x8c\x0bcollections\x8c\x0bOrderedDict\x93", b"}\x8c\x06valuesK\x05sb",
    b"(" * 120 + b"]" + b"l" * 120, b"r\x00\x00\x00\x01", b"\x95\x00\x00\x00\x00\x00\x00\x00\x00",
]


def _depth(value: Any) -> int:
    """The nesting depth of a decoded value (iterative)."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH + 1:
            break
        if isinstance(v, dict):
            todo += [(x, d + 1) for x in (*v.keys(), *v.values())]
        elif isinstance(v, (list, tuple, set, frozenset)):
            todo += [(x, d + 1) for x in v]
    return deepest


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40))
def test_any_stream_of_pieces_decodes_bounded_or_refuses(pieces: list[bytes]) -> None:
    """A value (no deeper than MAX_DEPTH) or a Refused; render always answers; never an
    exception (before: BUILD on a row raised TypeError in render, deep values were decoded)."""
    data = b"\x80\x04" + b"".join(pieces) + b"."
    got = loads(data)
    if not isinstance(got, Refused):
        assert _depth(got) <= MAX_DEPTH
    text, reason = render(got)
    assert (text is None) != (reason is None)


def test_an_unforeseen_failure_stays_on_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a value's decoding raises, the table keeps its other values: the last line of
    defence behind the bounds above (before: the exception ended the read of the table)."""
    import statequery.pickled as pickled

    real = pickled.render

    def render_or_fail(value: Any, max_chars: int = pickled.MAX_CHARS) -> Any:
        if value == {"fail": True}:
            raise TypeError("unforeseen")
        return real(value, max_chars)

    monkeypatch.setattr(pickled, "render", render_or_fail)
    bad = pickle.dumps({"fail": True})
    t = add_python_columns(pa.table({"value": pa.array([GOOD, bad, GOOD], pa.binary())}))
    assert t.column("value_py").to_pylist() == [GOOD_JSON, None, GOOD_JSON]
    assert t.column("value_py_reason").to_pylist() == [
        None, "not rendered: TypeError: unforeseen", None]
