"""Kryo 2.24 (Flink 1.x's KryoSerializer) decoded with the job's classes (issue 32 item 2).

Real savepoints: the v1.15/v1.20 ttl-kryo fixtures (TtlKryoJob on those releases) hold
``Note(label, total)`` values; ``tests/fixtures/flink-jobs/note.jar`` is
``examples/flink-jobs/src/statequery/fixtures/Note.java`` compiled (``javac --release 11``). The
model's bytes of each value (tests/fixtures/expected/ttl-kryo-hashmap-canonical.jsonl, the same
job's events) give the totals. Byte-level tests: Kryo 2.24's own encoding where it differs from
Kryo 5 (big-endian fixed widths, enum references), from Kryo 2.24.0's source."""

from __future__ import annotations

import base64
import glob
import json
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import FIXTURES, fixture_classpath, fixture_dir, read_jsonl
from serializers.test_classfile import synthetic_class
from support.entries import canonical, savepoint_entries

import statequery
from statequery.serializers.classfile import ClassPath
from statequery.serializers.kryo import KryoCodec, KryoRegistration, KryoUndecodable

NOTE_JAR = FIXTURES / "flink-jobs" / "note.jar"
TTL_1X = ["v1.15-ttl-kryo-hashmap-canonical", "v1.15-ttl-kryo-rocksdb-native",
          "v1.20-ttl-kryo-hashmap-canonical", "v1.20-ttl-kryo-rocksdb-native"]
OP = "ttl-kryo-state"
OP_KT = "kryo-types"
KT_1X = ["v1.20-types-kryo-hashmap-canonical", "v1.20-types-kryo-rocksdb-native"]


def _zigzag_varlong(data: bytes) -> int:
    result = 0
    for i, b in enumerate(data):
        result |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            assert i == len(data) - 1
            break
    return (result >> 1) ^ -(result & 1)


def _model() -> dict[tuple[str, str, str | None], dict[str, Any]]:
    """(state, key, user_key) -> Note's fields, from the model's bytes (class id, markers, the
    ASCII label, the total's zig-zag varlong)."""
    out = {}
    for e in read_jsonl(FIXTURES / "expected" / "ttl-kryo-hashmap-canonical.jsonl"):
        if e["state"] not in ("kryo-value", "kryo-map"):
            continue
        raw = base64.b64decode(e["value"]["$raw"])
        label = e["key"] if e["state"] == "kryo-value" else e["user_key"]
        assert raw[:3] == b"\x57\x01\x01" and raw[3:3 + len(label)].upper() != b""
        out[(e["state"], e["key"], e.get("user_key"))] = {
            "label": label, "total": _zigzag_varlong(raw[3 + len(label):])}
    return out


@pytest.mark.parametrize("name", TTL_1X)
def test_flink_1x_kryo_values_decode_with_the_jar(name: str, decode_path: str) -> None:
    """A Flink 1.x savepoint's Kryo values decode with the job's jar: every one equals the
    model (before Kryo 2.24 decoding, a 1.x savepoint set the classpath aside: all raw)."""
    model = _model()
    path = glob.glob(str(FIXTURES / name / "savepoint-*"))[0]
    with statequery.open(path, use_snapshot=False, classpath=[NOTE_JAR]) as sp:
        got = {}
        for state in ("kryo-value", "kryo-map"):
            t = sp.read(OP, state)
            assert t.schema.field("value").type == pa.struct(
                [("label", pa.string()), ("total", pa.int64())])
            assert t.column("value_raw").null_count == t.num_rows
            for r in t.to_pylist():
                got[(state, r["key"], r.get("user_key"))] = r["value"]
        assert got == model and len(got) == 50
        meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()}
        assert meta["kryo-value"]["value_decoding"] == "kryo-classpath"


@pytest.mark.parametrize("name", KT_1X)
def test_the_kryo_types_job_on_flink_1_20_equals_the_oracle(name: str, decode_path: str) -> None:
    """KryoTypesJob on Flink 1.20.5 (every Kryo shape, Kryo 2.24 bytes), read with its job.jar:
    equal to 1.20.5's own dump with the classes, entry by entry; no value raw."""
    from test_kryo_types import _present

    with statequery.open(str(fixture_dir(name)), use_snapshot=False,
                         classpath=fixture_classpath(name)) as sp:
        got = sorted(canonical(_present(json.loads(line))) for line in savepoint_entries(sp))
        want = sorted(canonical(e) for e in read_jsonl(FIXTURES / "dump" / f"{name}.jsonl"))
        assert len(got) == len(want) == 42
        assert got == want
        for state in ("order", "shapes", "shape-log"):
            t = sp.read(OP_KT, state)
            assert t.column("value_raw").null_count == t.num_rows
        kryo24 = sp.read(OP_KT, "order", key="k1").to_pylist()[0]
    # the bytes are not Kryo 5's: the 2.x fixture's order k1 has the same value, other bytes
    with statequery.open(str(fixture_dir(name)), use_snapshot=False) as sp:
        raw24 = sp.read(OP_KT, "order", key="k1").column("value").to_pylist()[0]
    with statequery.open(str(fixture_dir("types-kryo-hashmap-canonical")),
                         use_snapshot=False) as sp:
        raw5 = sp.read(OP_KT, "order", key="k1").column("value").to_pylist()[0]
    with statequery.open(str(fixture_dir("types-kryo-hashmap-canonical")), use_snapshot=False,
                         classpath=fixture_classpath("types-kryo-hashmap-canonical")) as sp:
        assert sp.read(OP_KT, "order", key="k1").to_pylist()[0]["value"] == kryo24["value"]
    assert raw24 != raw5


def test_flink_1x_without_the_class_stays_raw_naming_it() -> None:
    jar = FIXTURES / "types-kryo-hashmap-canonical" / "job.jar"  # no statequery.fixtures.Note
    path = glob.glob(str(FIXTURES / TTL_1X[2] / "savepoint-*"))[0]
    with statequery.open(path, use_snapshot=False, classpath=[jar]) as sp:
        t = sp.read(OP, "kryo-value")
        assert t.schema.field("value").type == pa.binary()
        assert all("statequery.fixtures.Note" in r for r in t.column("value_reason").to_pylist())


def _classes(tmp_path: Path) -> ClassPath:
    """a.Sample {double d; float f; short s; char c; a.Tone t; a.Tone u; short[] ss}, a.Tone an
    enum {LOW, HIGH} (final: no class written for its fields)."""
    (tmp_path / "a").mkdir()
    tone = "La/Tone;"
    (tmp_path / "a" / "Tone.class").write_bytes(synthetic_class(
        "a.Tone", "java.lang.Enum", (), (("LOW", tone, 0x4019), ("HIGH", tone, 0x4019)),
        access=0x4031))
    (tmp_path / "a" / "Sample.class").write_bytes(synthetic_class(
        "a.Sample", "java.lang.Object", (),
        (("d", "D", 0x2), ("f", "F", 0x2), ("s", "S", 0x2), ("c", "C", 0x2), ("t", tone, 0x2),
         ("u", tone, 0x2), ("ss", "[S", 0x2)), access=0x31))
    return ClassPath([tmp_path])


def test_kryo_2_24_fixed_widths_are_big_endian_and_enums_are_references(tmp_path: Path) -> None:
    """Kryo 2.24's Output writes short/char/float/double big-endian (Kryo 5: little-endian),
    and its MapReferenceResolver tracks enums: the second use of a constant in a value is a
    back reference (``id + 2``). Fields in name order: c, d, f, s, ss, t, u."""
    cp = _classes(tmp_path)
    codec = KryoCodec(cp, "a.Sample", (KryoRegistration("a.Sample"),), kryo_version=2)
    data = (b"\x57\x01"                               # class id 85, a new object (ref id 0)
            + struct.pack(">H", 0xE9)                 # c: 'é'
            + struct.pack(">d", -2.5)                 # d
            + struct.pack(">f", 0.75)                 # f
            + struct.pack(">h", -300)                 # s
            + b"\x01\x04" + struct.pack(">hhh", 1, -2, 3)  # ss: new (ref 1), length + 1, BE
            + b"\x01\x02"                             # t: new object (ref 2), ordinal 1 + 1
            + b"\x04")                                # u: a back reference to ref 2
    assert codec.decode(data) == {"c": "\u00e9", "d": -2.5, "f": 0.75, "s": -300,
                                  "ss": [1, -2, 3], "t": "HIGH", "u": "HIGH"}
    # the same bytes are not Kryo 5's (enums untracked, little-endian): never the same value
    kryo5 = KryoCodec(cp, "a.Sample", (KryoRegistration("a.Sample"),))
    try:
        assert kryo5.decode(data) != codec.decode(data)
    except KryoUndecodable:
        pass
    for cut in range(len(data)):
        with pytest.raises(KryoUndecodable):
            codec.decode(data[:cut])
    with pytest.raises(KryoUndecodable, match="1 bytes left"):
        codec.decode(data + b"\x00")
    # a back reference to an object not read yet
    with pytest.raises(KryoUndecodable, match="reference"):
        codec.decode(data[:-1] + b"\x09")


def test_mutated_kryo_2_24_values_decode_or_stay_raw_never_crash() -> None:
    """Seeded byte flips, insertions and deletions of the 1.20 fixture's values, decoded as
    Kryo 2.24: each row is a value of the Arrow type or raw with a reason, never an
    exception; the unmutated values decode, and a truncation or a trailing byte never does."""
    import random

    from statequery.arrow.kryo import UserTypes, _column, classpath_of, kryo_codec

    name = "v1.20-types-kryo-hashmap-canonical"
    jar = fixture_classpath(name)
    assert jar is not None
    rng = random.Random(24)
    with statequery.open(str(fixture_dir(name)), use_snapshot=False) as sp:
        for state in ("order", "shapes", "shape-log"):
            spec = sp.state(OP_KT, state).value
            values = sp.read(OP_KT, state).column("value").to_pylist()
            codec = kryo_codec(spec, UserTypes(classpath_of(jar), kryo_2_24=True))
            assert codec is not None and codec.kryo_version == 2
            lists = state == "shape-log"
            typ = pa.list_(codec.arrow_type()) if lists else codec.arrow_type()
            if not lists:
                for data in values[:2]:
                    codec.decode(data)
                    for cut in range(len(data)):
                        with pytest.raises(KryoUndecodable):
                            codec.decode(data[:cut])
                    with pytest.raises(KryoUndecodable, match="1 bytes left"):
                        codec.decode(data + b"\x00")
            mutated: list[bytes | None] = []
            for data in values:
                for _ in range(100):
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
