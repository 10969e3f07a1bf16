"""PyFlink DataStream savepoints (docs/fixtures.md, "The PyFlink jobs") and the restricted
unpickler (statequery.pickled, docs/decoding.md "Pickled Python values").

The ``pyflink-*`` fixtures are also read entry by entry against Flink's dump by test_reader.py
and test_fixture_oracle.py; here: the typed values a PyFlink user declared, and the Python values
PyFlink pickled, as ``read(..., pickled=True)`` shows them, on both decode paths.
"""

from __future__ import annotations

import datetime as dt
import json
import pickle
import sys
import types
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import fixture_dir, fixture_records
from hypothesis import given, settings
from hypothesis import strategies as st

import statequery
import statequery.exceptions
from statequery.pickled import PyRow, Refused, loads, render

sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "flink-jobs"))
import pyflink_model as pm  # noqa: E402

PYFLINK = sorted(r["name"] for r in fixture_records() if r["job"].startswith("pyflink-"))
THREAD = [n for n in PYFLINK if "-thread-" in n]
PROCESS = [n for n in PYFLINK if "-process-" in n]


def test_fixtures_listed() -> None:
    assert len(THREAD) == 2 and len(PROCESS) == 2, PYFLINK


def _open(name: str) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False)


def _plain(v: Any) -> Any:
    """The model's Python value as the ``*_py`` JSON shows it (an independent spelling of
    statequery.pickled.render for the types the job pickles)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(_plain(x) for x in v)
    if isinstance(v, bytes):
        import base64

        return {"$bytes": base64.b64encode(v).decode()}
    if isinstance(v, dt.date):
        return v.isoformat()
    return v


def _by_user(table: Any) -> dict[str, Any]:
    return {r["key"]["f0"]: r for r in table.to_pylist()}


@pytest.mark.parametrize("name", THREAD)
def test_thread_mode_typed_and_pickled_values(name: str, decode_path: str) -> None:
    sp = _open(name)
    model = pm.typed_state()
    # declared types: Java serializers, typed columns; keys ROW<f0 STRING> (KeyByKeySelector)
    counts = {r["key"]["f0"]: r["value"] for r in sp.read("py-typed", "count").to_pylist()}
    assert counts == {u: s["count"] for u, s in model.items()}
    assert counts == {f"user-{i}": 10 for i in range(6)}
    labels = {r["key"]["f0"]: r["value"] for r in sp.read("py-typed", "label").to_pylist()}
    assert labels == {u: s["label"] for u, s in model.items()}
    assert labels["user-0"] == "" and labels["user-1"] == "\U0001F600 smile"
    assert sp.read("py-typed", "count", key="user-3").to_pylist()[0]["value"] == 10
    recent = {r["key"]["f0"]: r["value"] for r in sp.read("py-typed", "recent").to_pylist()}
    assert recent == {u: s["recent"] for u, s in model.items()}
    # a ReducingState is a ValueState in thread mode
    assert {r["key"]["f0"]: r["value"] for r in sp.read("py-typed", "sum").to_pylist()} == {
        u: s["sum"] for u, s in model.items()
    }
    decs = {r["key"]["f0"]: r["value"] for r in sp.read("py-typed", "dec").to_pylist()}
    assert decs == {u: format(s["dec"], "f") for u, s in model.items()}  # BigDecimal: plain text
    assert decs["user-1"] == "99999999999999999998.99"
    attrs = {r["key"]["f0"]: dict(r["value"]) for r in sp.read("py-typed", "attrs").to_pylist()}
    assert attrs == {u: s["attrs"] for u, s in model.items()}
    assert attrs["user-0"] == {"": pm.LONG_MIN}

    # pickled: a dict of plain data, or a user class (refused, its bytes kept)
    blob = _by_user(sp.read("py-typed", "blob", pickled=True))
    for user, s in model.items():
        row = blob[user]
        if isinstance(s["blob"], pm.Point):
            assert row["value_py"] is None
            assert "pyflink_model.Point" in row["value_py_reason"]
            assert row["value"].startswith(b"\x80\x04")  # the raw pickle stays
        else:
            assert json.loads(row["value_py"]) == _plain(s["blob"]), user
            assert row["value_py_reason"] is None
    assert json.loads(blob["user-1"]["value_py"])["big"] == 2**70 + 1
    blobs = _by_user(sp.read("py-typed", "blobs", pickled=True))
    assert {u: json.loads(r["value_py"]) for u, r in blobs.items()} == {
        u: _plain(s["blobs"]) for u, s in model.items()
    }
    # ROW and TUPLE state values are pickled in thread mode (PyFlink's Row: fields or a list)
    avg = _by_user(sp.read("py-typed", "avg", pickled=True))
    assert {u: json.loads(r["value_py"]) for u, r in avg.items()} == {
        u: s["avg"] for u, s in model.items()
    }
    ext = _by_user(sp.read("py-typed", "extremes", pickled=True))
    assert {u: json.loads(r["value_py"]) for u, r in ext.items()} == {
        u: _plain(s["extremes"]) for u, s in model.items()
    }
    assert json.loads(ext["user-1"]["value_py"])[:5] == [pm.LONG_MIN, pm.LONG_MAX, pm.INT_MIN,
                                                         pm.INT_MAX, 1.5]
    detail = sp.read("py-typed", "detail-by-category", pickled=True).to_pylist()
    got = {(r["key"]["f0"], r["user_key"]): json.loads(r["value_py"]) for r in detail}
    assert got == {
        (u, cat): [d["total"], d["last"], [d["where"]["city"], d["where"]["zip"]]]
        for u, s in model.items()
        for cat, d in s["detail-by-category"].items()
    }
    # window contents: the Python ReduceFunction's tuple, pickled, per TimeWindow
    win = sp.read("py-window", "window-contents", pickled=True).to_pylist()
    got_w = {(r["key"]["f0"], int(r["namespace"]["start"].timestamp() * 1000)):
             json.loads(r["value_py"]) for r in win}
    assert got_w == {k: list(v) for k, v in pm.window_sums().items()}


@pytest.mark.parametrize("name", PYFLINK)
def test_pickled_keys(name: str, decode_path: str) -> None:
    """``key_by`` without ``key_type``: the key is ROW<f0 BYTES>, a pickle of the Python key
    (``pickle`` protocol 4 in thread mode, ``cloudpickle`` protocol 5 in process mode)."""
    sp = _open(name)
    prefix = "python-state-" if name in PROCESS else ""
    table = sp.read("py-pickled", prefix + "pair-count", pickled=True)
    meta = [m for m in sp.state_meta().to_pylist() if m["state_name"] == prefix + "pair-count"]
    assert [m["key_type"] for m in meta] == ["ROW<f0 BYTES>"]
    rows = table.to_pylist()
    got = {tuple(json.loads(r["key_py"])): r["value"] for r in rows}
    if name in PROCESS:  # a value state is a one-element list state of coder bytes (int64)
        got = {k: int.from_bytes(v[0], "big", signed=True) for k, v in got.items()}
    assert got == pm.pair_counts()
    proto = 5 if name in PROCESS else 4
    assert all(r["key"]["f0"][:2] == bytes([0x80, proto]) for r in rows)
    assert all(r["key_py_reason"] is None for r in rows)
    # a lookup by the key's bytes (thread mode: pickle.dumps of the Python key); text that is
    # not base64 does not fit a BYTES key field
    if name in THREAD:
        got_one = sp.read("py-pickled", "pair-count", key=pickle.dumps(("user-1", 1))).to_pylist()
        assert [r["value"] for r in got_one] == [pm.pair_counts()[("user-1", 1)]]
    with pytest.raises(statequery.exceptions.InvalidKeyError, match="f0 is BYTES"):
        sp.read("py-pickled", prefix + "pair-count", key={"f0": "user-0"})


@pytest.mark.parametrize("name", PROCESS)
def test_process_mode_layout(name: str, decode_path: str) -> None:
    """Process mode (Beam): every keyed state ``python-state-<name>``, value, reducing and
    aggregating states one-element list states of PyFlink coder bytes, map and broadcast keys
    ByteArrayWrapper (read as bytes); everything decodable."""
    sp = _open(name)
    meta = sp.state_meta().to_pylist()
    mine = [m for m in meta if m["operator_uid"] in ("py-typed", "py-pickled", "py-window",
                                                      "py-broadcast")]
    assert all(m["decodable"] for m in mine), [m["reason"] for m in mine if not m["decodable"]]
    names = {m["state_name"] for m in mine if not m["state_name"].startswith("_timer_state/")}
    assert names == {f"python-state-{n}" for n in (
        "count", "label", "recent", "detail-by-category", "sum", "avg", "dec", "ts", "tags",
        "attrs", "extremes", "blob", "blobs", "pair-count", "window-contents", "rules")}
    kinds = {m["state_name"]: m["kind"] for m in mine}
    assert kinds["python-state-sum"] == kinds["python-state-count"] == "list"
    assert kinds["python-state-detail-by-category"] == "map"
    rules = {r["user_key"]: r["value"] for r in sp.read("py-broadcast", "python-state-rules")
             .to_pylist()}

    def coded(s: str) -> bytes:
        return len(s.encode()).to_bytes(4, "big") + s.encode()

    assert rules == {coded(k): coded(v) for k, v in pm.RULES}
    model = pm.typed_state()
    blob = _by_user(sp.read("py-typed", "python-state-blob", pickled=True))
    for user, s in model.items():
        if isinstance(s["blob"], pm.Point):
            assert "pyflink_model.Point" in blob[user]["value_py_reason"]
        else:
            assert json.loads(blob[user]["value_py"]) == [_plain(s["blob"])]
    count = _by_user(sp.read("py-typed", "python-state-count"))
    assert {u: int.from_bytes(r["value"][0], "big") for u, r in count.items()} == {
        u: s["count"] for u, s in model.items()
    }


# -- the restricted unpickler -----------------------------------------------------------------


class _Evil:
    def __reduce__(self) -> Any:
        import os

        return (os.system, ("touch /nonexistent-statequery-evil",))


def test_code_in_a_pickle_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Touch:
        def __reduce__(self) -> Any:
            return (Path.touch, (marker,))

    for data in (pickle.dumps(Touch()), pickle.dumps(_Evil()), pickle.dumps(_Evil(), 2),
                 pickle.dumps([1, {"a": Touch()}]), pickle.dumps(print)):
        out = loads(data)
        assert isinstance(out, Refused), out
        assert "only plain data is decoded" in out.reason
    assert not marker.exists()
    assert "refers to posix.system" in loads(pickle.dumps(_Evil())).reason
    # the module a pickle names is never imported
    fake = types.ModuleType("statequery_never_imported")

    class K:
        pass

    K.__module__ = K.__qualname__ = "statequery_never_imported"
    K.__qualname__ = "K"
    fake.K = K  # type: ignore[attr-defined]
    sys.modules["statequery_never_imported"] = fake
    try:
        data = pickle.dumps(K())
    finally:
        del sys.modules["statequery_never_imported"]
    assert "statequery_never_imported.K" in loads(data).reason
    assert "statequery_never_imported" not in sys.modules


def test_plain_data_of_every_protocol() -> None:
    value = {"n": None, "b": True, "i": -(2**80), "f": float("inf"), "c": 1 + 2j,
             "s": "é\U0001F600", "y": b"\x00\xff", "ba": bytearray(b"x"), "t": (1, (2,)),
             "l": [1, [2]], "set": {3, 1}, "fs": frozenset({"a"}), "d": {1: "x"},
             "dt": dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc),
             "date": dt.date(2024, 2, 29), "td": dt.timedelta(days=1, microseconds=2),
             "dec": Decimal("-1.50")}
    for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
        assert loads(pickle.dumps(value, proto)) == value, proto
    text, reason = render(loads(pickle.dumps(value)))
    assert reason is None
    got = json.loads(text)
    assert got["set"] == [1, 3] and got["t"] == [1, [2]] and got["f"] == "Infinity"
    assert got["d"] == [{"key": 1, "value": "x"}] and got["dec"] == "-1.50"
    assert got["y"] == {"$bytes": "AP8="} and got["dt"] == "2024-01-02T03:04:05.000006+00:00"


def test_pyflink_rows_without_pyflink() -> None:
    """PyFlink's Row pickles as ``pyflink.common.types._create_row(fields, values, RowKind)``:
    rebuilt as a PyRow, PyFlink never imported."""
    mod = types.ModuleType("pyflink.common.types")

    class RowKind(int):
        def __reduce__(self) -> Any:
            return (RowKind, (int(self),))

    def _create_row(fields: Any, values: Any, row_kind: Any = None) -> Any:
        raise AssertionError("never called")

    class Row(tuple):  # type: ignore[type-arg]
        def __reduce__(self) -> Any:
            return (_create_row, (["a", "b"], tuple(self), RowKind(2)))

    for obj, name in ((RowKind, "RowKind"), (_create_row, "_create_row"), (Row, "Row")):
        obj.__module__ = "pyflink.common.types"
        obj.__qualname__ = name
        setattr(mod, name, obj)
    saved = {k: sys.modules.get(k) for k in ("pyflink", "pyflink.common", "pyflink.common.types")}
    sys.modules.update({"pyflink": types.ModuleType("pyflink"),
                        "pyflink.common": types.ModuleType("pyflink.common"),
                        "pyflink.common.types": mod})
    try:
        data = pickle.dumps(Row((1, None)))
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    out = loads(data)
    assert out == PyRow(("a", "b"), (1, None), "+U")
    assert json.loads(render(out)[0]) == {"$row_kind": "+U", "row": {"a": 1, "b": None}}


def test_refusals_and_bounds() -> None:
    assert loads(b"\x00\x00\x00\x05hello").reason.startswith("not a pickle")  # a Java byte[]
    assert loads(pickle.dumps(1) + b"x").reason.startswith("not a pickle")  # ends badly
    data = pickle.dumps([1])
    assert loads(data + b".").reason == "1 bytes after the pickle's end"
    assert loads(len(data).to_bytes(4, "big") + data) == [1]  # process mode's coder framing
    assert loads(b"\x80\x04\x95\xff\xff.").reason.startswith("not a valid pickle")
    # a value shared 2**40 times in a few hundred bytes: decoded, not rendered
    v: list[Any] = [0]
    for _ in range(40):
        v = [v, v]
    decoded = loads(pickle.dumps(v))
    assert not isinstance(decoded, Refused)
    text, reason = render(decoded)
    assert text is None and reason.startswith("too large to render")
    # sizes are not data: bytearray(10**12) is refused, not allocated
    assert "bytearray of other" in loads(b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00"
                                         b"\x8c\x08builtins\x8c\tbytearray\x93\x8a\x06\x00"
                                         b"\x10\xa5\xd4\xe8\x00\x85R.").reason
    assert loads(pickle.dumps(bytearray(b"ab"), 2)) == bytearray(b"ab")
    huge = loads(pickle.dumps(2**20000))
    assert huge == 2**20000 and render(huge)[1] == "too large to render: an integer of 20001 bits"
    # a list that holds itself: not plain data (JSON has no cycles), refused when decoded
    loop: list[Any] = []
    loop.append(loop)
    assert loads(pickle.dumps(loop)).reason == "a container that holds itself"


def test_python_columns_in_duckdb() -> None:
    """The ``*_py`` columns are JSON text an engine can query (DuckDB's json functions)."""
    import duckdb
    sp = _open("pyflink-thread-hashmap-canonical")
    blob = sp.read("py-typed", "blob", pickled=True)  # noqa: F841  (DuckDB reads it by name)
    rows = duckdb.sql(
        "SELECT key.f0 AS u, json_extract_string(value_py, '$.name') AS name, "
        "CAST(json_extract(value_py, '$.pair[0]') AS INTEGER) AS p0, value_py_reason IS NULL "
        "FROM blob ORDER BY u"
    ).fetchall()
    assert rows == [(f"user-{u}", f"user-{u}" if u < 4 else None, u if u < 4 else None, u < 4)
                    for u in range(6)]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(2, 5))
def test_any_bytes_decode_or_refuse(body: bytes, proto: int) -> None:
    """Damaged or hostile bytes behind a pickle header give a value or a Refused, never an
    exception, and render() always answers."""
    for data in (bytes([0x80, proto]) + body + b".", body):
        out = loads(data)
        text, reason = render(out)
        assert (text is None) != (reason is None)


# -- pickled in every front end (one option: ScanTask.pickled) ---------------------------------


def test_pickled_columns_in_state_meta_and_schemas() -> None:
    """``state_meta.pickled_columns`` names the bytes columns from the types alone; a pickled
    read's schema is that of its types, the same for zero rows and for the streamed reader."""
    from statequery.pickled import python_schema
    from statequery.reader import read_state, schema_of

    sp = _open("pyflink-thread-hashmap-canonical")
    cols = {r["table_name"]: r["pickled_columns"] for r in sp.state_meta().to_pylist()}
    assert cols["py_typed__blob"] == ["value"] and cols["py_typed__count"] == []
    assert cols["py_pickled__pair_count"] == ["key"]
    assert cols["py_typed__detail_by_category"] == ["value"]  # MAP<STRING, pickled ROW>
    proc = _open("pyflink-process-hashmap-canonical")
    pcols = {r["table_name"]: r["pickled_columns"] for r in proc.state_meta().to_pylist()}
    assert pcols["py_pickled__python_state_pair_count"] == ["key", "value"]
    assert pcols["py_broadcast__python_state_rules"] == ["user_key", "value"]

    whole = sp.read("py-pickled", "pair-count", pickled=True)
    assert whole.column_names == ["key_group", "key", "key_py", "key_py_reason", "namespace",
                                  "value"]
    assert whole.schema == schema_of(sp, "py-pickled", "pair-count", pickled=True)
    empty = sp.read("py-pickled", "pair-count", key_groups=[], pickled=True)
    assert empty.num_rows == 0 and empty.schema == whole.schema
    assert sp.read("py-typed", "count", pickled=True).schema == sp.read("py-typed",
                                                                       "count").schema
    streamed = [r for b in read_state(sp, "py-pickled", "pair-count", batch_size=7,
                                      pickled=True) for r in b.to_pylist()]
    assert streamed == whole.to_pylist()
    assert {tuple(json.loads(r["key_py"])): r["value"] for r in streamed} == pm.pair_counts()
    task = sp.plan("py-typed", "blob", pickled=True)[0]
    assert task.pickled and task.schema() == python_schema(sp.read("py-typed", "blob").schema)


def test_pickled_in_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """A human sees the Python values (the table view renders them); --json and --out keep
    Savepoint.read's columns unless --pickled."""
    from statequery.cli import main

    path = str(fixture_dir("pyflink-thread-hashmap-canonical"))
    assert main(["read", path, "py_pickled__pair_count", "--json", "--pickled"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {tuple(json.loads(r["key_py"])): r["value"] for r in rows} == pm.pair_counts()
    assert main(["read", path, "py_pickled__pair_count", "--json"]) == 0
    assert all("key_py" not in json.loads(line)
               for line in capsys.readouterr().out.splitlines())
    assert main(["read", path, "--operator", "py-typed", "--state", "blob", "--key",
                 "user-2"]) == 0
    shown = capsys.readouterr().out
    assert "value_py" in shown and '"name":"user-2"' in shown
    assert main(["read", path, "py_typed__blob", "--key", "user-2", "--no-pickled"]) == 0
    assert "value_py" not in capsys.readouterr().out
    assert main(["lookup", path, "user-1", "--operator", "py-typed", "--json",
                 "--pickled"]) == 0
    found = {r["state"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    model = pm.typed_state()["user-1"]
    assert json.loads(found["blobs"]["value_py"]) == _plain(model["blobs"])
    assert "value_py" not in found["count"]  # a LONG value: no bytes column
    assert main(["inspect", path]) == 0
    assert "11 state(s) hold bytes" in capsys.readouterr().out
    assert main(["sql", "SELECT 1 FROM x.y", "--spark", "--pickled"]) == 1
    assert "attach --pickled" in capsys.readouterr().err


def test_table_view_hides_pickle_columns_of_java_bytes(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A Java byte[] (the source's reader state of the shipped catalog) is a bytes column too;
    the table view does not show two columns saying "not a pickle" on every row, unless asked
    (--pickled), and --json keeps the columns the types give."""
    from statequery.cli import main

    path = str(Path(__file__).parents[2] / "catalog" / "user_activity")
    argv = ["read", path, "--operator", "fixture-source", "--state", "SourceReaderState"]
    assert main(argv) == 0
    assert "value_py" not in capsys.readouterr().out
    assert main([*argv, "--pickled"]) == 0
    assert "not a pickle" in capsys.readouterr().out
    assert main([*argv, "--json", "--pickled"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows and all(r["value_py"] is None and r["value_py_reason"].startswith("not a pickle")
                        for r in rows)


def test_pickled_in_sql(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``statequery.sql(..., pickled=True)`` / ``sql --pickled``: state tables with the *_py
    columns, queryable as JSON; the key push-down still reads one key group."""
    from statequery.catalog import Catalog
    from statequery.cli import main

    (tmp_path / "pyt").symlink_to(fixture_dir("pyflink-process-hashmap-canonical"))
    cat = Catalog(str(tmp_path))
    t = statequery.sql(
        "SELECT key_py, value_py, value_py_reason FROM pyt.py_pickled__python_state_pair_count",
        cat, pickled=True)
    got = {tuple(json.loads(r["key_py"])): r for r in t.to_pylist()}
    assert set(got) == set(pm.pair_counts())
    # process mode: the value is a one-element list of coder bytes (int64), not a pickle
    assert all(r["value_py"] == "[null]" and "not a pickle" in r["value_py_reason"]
               for r in got.values())
    blob = statequery.sql(
        "SELECT key.f0 AS u, get_json_object(value_py, '$[0].name') AS name "
        "FROM pyt.py_typed__python_state_blob WHERE key = '{\"f0\": \"user-3\"}'",
        cat, pickled=True)
    assert blob.to_pylist() == [{"u": "user-3", "name": "user-3"}]
    with pytest.raises(statequery.exceptions.InvalidOptionError, match="value_py"):
        statequery.sql("SELECT value_py FROM pyt.py_typed__python_state_blob", cat)
    assert main(["sql", "SELECT key.f0 AS u, value_py FROM pyt.py_typed__python_state_blob "
                 "ORDER BY u", "--catalog", str(tmp_path), "--json", "--pickled"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    model = pm.typed_state()
    assert len(rows) == len(model)
    for r in rows:
        want = model[r["u"]]["blob"]
        if not isinstance(want, pm.Point):
            assert json.loads(r["value_py"]) == [_plain(want)]
