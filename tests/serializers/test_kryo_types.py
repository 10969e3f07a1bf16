"""Kryo values decoded with the job's jar (issue 32): the types-kryo-* fixtures, written by
src/statequery/kryotypes/KryoTypesJob.java with job.jar beside each savepoint, equal the oracle
(SavepointDump with the job's classes, -Dstatequery.dump.kryoFields=true) entry by entry, on both
decode paths; without the jar the values are raw bytes with a reason naming the option."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import FIXTURES, fixture_dir, read_jsonl
from support.entries import canonical, savepoint_entries

import statequery
from statequery.arrow.kryo import UserTypes, kryo_codec
from statequery.exceptions import InvalidOptionError
from statequery.serializers.kryo import KryoUndecodable

KRYO = ["types-kryo-hashmap-canonical", "types-kryo-rocksdb-native"]
OP = "kryo-types"


def _jar(name: str) -> Path:
    return FIXTURES / name / "job.jar"


def _open(name: str, classpath: Any = None) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False, classpath=classpath)


def _present(value: Any) -> Any:
    """The oracle renders a value of an interface-typed field as ``{"class", Impl: fields}``;
    the Arrow struct also has the other implementations' branches, null: drop those."""
    if isinstance(value, dict):
        return {k: _present(v) for k, v in value.items() if not (v is None and "class" in value)}
    if isinstance(value, list):
        return [_present(v) for v in value]
    return value


@pytest.mark.parametrize("name", KRYO)
def test_kryo_values_equal_the_oracle(name: str, decode_path: str) -> None:
    with _open(name, [_jar(name)]) as sp:
        got = sorted(canonical(_present(json.loads(line))) for line in savepoint_entries(sp))
        want = sorted(canonical(e) for e in read_jsonl(FIXTURES / "dump" / f"{name}.jsonl"))
        assert len(got) == len(want) == 42
        assert got == want
        for state in ("order", "shapes", "shape-log"):
            t = sp.read(OP, state)
            typ = t.schema.field("value").type
            assert pa.types.is_struct(typ.value_type if state == "shape-log" else typ)
            # no value stays raw
            assert t.column("value_raw").null_count == t.num_rows
            assert t.column("value_reason").null_count == t.num_rows
        order = sp.read(OP, "order", key="k4").to_pylist()[0]["value"]
        assert order["customer"] == "non-BMP \U0001f600 smile" and order["letter"] == "\u00e9"
        meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()}
        assert meta["order"]["value_decoding"] == "kryo-classpath"
        assert meta["order"]["value_decoding_hint"] is None


@pytest.mark.parametrize("name", KRYO)
def test_without_the_jar_values_are_raw_bytes_naming_the_option(name: str) -> None:
    with _open(name) as sp:
        t = sp.read(OP, "order")
        assert t.schema.field("value").type == pa.binary() and "value_raw" not in t.column_names
        values = t.column("value").to_pylist()
        assert t.num_rows == 8 and all(v.startswith(b"\x57\x01") for v in values)
        for reason in t.column("value_reason").to_pylist():
            assert "classpath=" in reason and "--classpath" in reason
        meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()}
        for state in ("order", "shapes"):
            assert meta[state]["value_decoding"] == "raw"
            assert "classpath=" in meta[state]["value_decoding_hint"]
        assert meta["SourceReaderState"]["value_decoding"] == "native"


def test_a_class_missing_from_the_jar_leaves_its_values_raw(tmp_path: Path) -> None:
    name = KRYO[0]
    jar = tmp_path / "no-circle.jar"
    with zipfile.ZipFile(_jar(name)) as src, zipfile.ZipFile(jar, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith("Circle.class"):
                dst.writestr(item, src.read(item))
    with _open(name, [jar]) as sp:
        rows = sp.read(OP, "shapes").to_pylist()
        raw = [r for r in rows if r["value"] is None]
        decoded = [r for r in rows if r["value"] is not None]
        assert raw and decoded and len(rows) == 24
        for r in raw:
            # Circle is not registered: written by name (1, name id 0, the name)
            assert r["value_raw"].startswith(b"\x01\x00statequery.kryotypes.Circl")
            assert "statequery.kryotypes.Circle" in r["value_reason"]
            assert "with the classpath" in r["value_reason"]
        assert all(r["value"]["class"].endswith("Rect") and r["value_raw"] is None
                   for r in decoded)
        # the order's Shape field may hold a Circle: those orders stay raw, the others decode
        orders = sp.read(OP, "order").to_pylist()
        assert any(o["value"] is None for o in orders) and any(o["value"] for o in orders)


def test_every_truncation_and_any_trailing_byte_is_refused() -> None:
    """A decode that does not use exactly the value's bytes is a failure, never a value."""
    name = KRYO[0]
    with _open(name) as sp:
        spec = sp.state(OP, "order").value
        values = sp.read(OP, "order").column("value").to_pylist()
    codec = kryo_codec(spec, UserTypes((str(_jar(name)),)))
    assert codec is not None
    for data in values[:3]:
        assert isinstance(codec.decode(data), dict)
        for cut in range(len(data)):
            with pytest.raises(KryoUndecodable):
                codec.decode(data[:cut])
        with pytest.raises(KryoUndecodable, match="1 bytes left after the value"):
            codec.decode(data + b"\x00")


def test_a_missing_or_foreign_classpath_entry_is_an_option_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="does not exist"):
        _open(KRYO[0], [tmp_path / "nope.jar"])
    (tmp_path / "x.jar").write_text("not a zip")
    with pytest.raises(InvalidOptionError, match="is not a jar"):
        _open(KRYO[0], str(tmp_path / "x.jar"))


def test_cli_classpath(tmp_path: Path) -> None:
    name = KRYO[1]
    cmd = [sys.executable, "-m", "statequery.cli", "read", str(fixture_dir(name)), "--operator",
           OP, "--state", "order",
           "--key", "k1", "--json"]
    with_jar = subprocess.run([*cmd, "--classpath", str(_jar(name))], capture_output=True,
                              text=True, timeout=120)
    assert with_jar.returncode == 0, with_jar.stderr
    row = json.loads(with_jar.stdout.strip().splitlines()[0])
    assert row["value"]["customer"] == "a" and row["value"]["counts"] is not None
    without = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert without.returncode == 0
    assert "--classpath" in json.loads(without.stdout.strip().splitlines()[0])["value_reason"]
    bad = subprocess.run([*cmd, "--classpath", str(tmp_path / "missing.jar")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "does not exist" in bad.stderr


def test_lookup_decodes_and_diff_stats_operator_tables_keep_bytes() -> None:
    name = KRYO[0]
    with _open(name, [_jar(name)]) as sp:
        found = sp.lookup("k2")
        order = next(t for (_, state), t in found.items() if state == "order")
        assert order.to_pylist()[0]["value"]["customer"] == "plain ascii"
        # read_operator (operator tables), diff and stats read the values as their bytes
        pairs = dict(sp.read_operator(OP, ["order"]))
        assert pairs["order"].schema.field("value").type == pa.binary()
        sp.diff(sp)
        assert sp.stats().table.num_rows > 0


def test_mutated_values_decode_or_stay_raw_never_crash() -> None:
    """Seeded byte flips, insertions and deletions of every fixture value: each row is a value
    of the Arrow type or raw with a reason, never an exception."""
    import random

    from statequery.arrow.kryo import _column

    name = KRYO[0]
    rng = random.Random(32)
    with _open(name) as sp:
        for state in ("order", "shapes", "shape-log"):
            spec = sp.state(OP, state).value
            values = sp.read(OP, state).column("value").to_pylist()
            codec = kryo_codec(spec, UserTypes((str(_jar(name)),)))
            assert codec is not None
            lists = state == "shape-log"  # elements joined by "," bytes
            typ = pa.list_(codec.arrow_type()) if lists else codec.arrow_type()
            mutated: list[bytes | None] = []
            for data in values:
                for _ in range(150):
                    b = bytearray(data)
                    for _ in range(rng.randint(1, 3)):
                        op, i = rng.random(), rng.randrange(len(b) or 1)
                        if op < 0.6 and b:
                            b[i] = rng.randrange(256)
                        elif op < 0.8:
                            b.insert(i, rng.randrange(256))
                        elif b:
                            del b[i]
                    mutated.append(bytes(b))
            arr, reasons, raw = _column(codec, typ, mutated, "Kryo", lists)
            assert len(arr) == len(mutated) and arr.type == typ
            for v, why, r, data in zip(arr.to_pylist(), reasons.to_pylist(), raw.to_pylist(),
                                       mutated, strict=True):
                assert (v is None) == (why is not None) == (r is not None)
                assert r is None or r == data


def test_a_catalog_database_with_its_job_jar_is_read_with_it(tmp_path: Path) -> None:
    """A catalog database folder that holds ``job.jar`` beside its savepoint (the layout of the
    types-kryo fixtures): SQL over it sees the Kryo values as structs."""
    (tmp_path / "kryo_types").symlink_to(FIXTURES / KRYO[0])
    t = statequery.sql(
        "SELECT key, value.customer AS c, value.shape.class AS s, value_reason "
        "FROM kryo_types.kryo_types__order ORDER BY key", catalog=str(tmp_path))
    rows = t.to_pylist()
    assert [r["c"] for r in rows[:3]] == ["", "a", "plain ascii"]
    assert rows[2]["s"] == "statequery.kryotypes.Circle"
    assert all(r["value_reason"] is None for r in rows)
    # attaching the catalog to Spark stores the jar in the tables' options
    from statequery.spark.catalog import attach_plans

    [plan] = attach_plans(str(tmp_path))
    jar = str(tmp_path / "kryo_types" / "job.jar")
    assert all(f"classpath '{jar}'" in s for s in plan.create_tables())


def test_a_spec_without_its_registrations_is_not_decoded() -> None:
    """A StateMeta snapshot written before Kryo decoding has no registrations: the values stay
    raw, the hint says how to get them (never a guess at the class ids)."""
    from dataclasses import replace

    from statequery.arrow.kryo import value_decoding

    with _open(KRYO[0]) as sp:
        spec = sp.state(OP, "order").value
    assert spec.kryo_registrations[0] == ("statequery.kryotypes.Order", False)
    decoding, hint = value_decoding(replace(spec, kryo_registrations=()),
                                    UserTypes((str(_jar(KRYO[0])),)))
    assert decoding == "raw" and "statequery snapshot" in hint


def test_the_registrations_survive_the_statemeta_snapshot(tmp_path: Path) -> None:
    name = KRYO[1]
    with _open(name) as sp:
        where = sp.write_snapshot(str(tmp_path / "meta.msgpack"))
    with statequery.open(str(fixture_dir(name)), snapshot=where, classpath=[_jar(name)]) as sp:
        assert sp.from_snapshot
        t = sp.read(OP, "shapes", key="k5")
        assert t.column("value_raw").null_count == t.num_rows == 3
        assert {r["value"]["class"] for r in t.to_pylist()} <= {
            "statequery.kryotypes.Circle", "statequery.kryotypes.Rect"}
