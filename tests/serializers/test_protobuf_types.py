"""Protobuf messages in Kryo state decoded with a descriptor set (issue 32 item 3): the
types-protobuf-* fixtures, written by src/statequery/prototypes/ProtoTypesJob.java (a message
class with chill-protobuf's Kryo form registered, its bytes made by Python's protobuf) with
descriptors.pb beside each savepoint. The oracle (SavepointDump, -Dstatequery.dump.kryoFields)
renders each message's bytes; this test decodes them independently (``MessageToDict``) and
compares them with statequery's reads entry by entry, on both decode paths."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import FIXTURES, fixture_dir, read_jsonl

import statequery
from statequery.arrow.kryo import kryo_codec, user_types
from statequery.exceptions import InvalidOptionError
from statequery.serializers.kryo import KryoUndecodable

pytest.importorskip("google.protobuf")  # the test extra brings it

from google.protobuf import (  # noqa: E402
    descriptor_pb2,
    descriptor_pool,
    json_format,
    message_factory,
    timestamp_pb2,
)
from google.protobuf.descriptor import FieldDescriptor as FD  # noqa: E402

PROTO = ["types-protobuf-hashmap-canonical", "types-protobuf-rocksdb-native"]
# ProtoTypesJob on Flink 1.20.5 (Kryo 2.24; generate_version_fixtures.py --job proto-types): a
# 1.x _metadata has no uids (the dump's operator_uid is ""); read by the uid's operator id
PROTO_1X = ["v1.20-types-protobuf-hashmap-canonical", "v1.20-types-protobuf-rocksdb-native"]
OP = "proto-types"
CLASS = "statequery.prototypes.Reading"
_64 = {FD.TYPE_INT64, FD.TYPE_UINT64, FD.TYPE_SINT64, FD.TYPE_FIXED64, FD.TYPE_SFIXED64}


def _descriptors(name: str) -> Path:
    return FIXTURES / name / "descriptors.pb"


def _open(name: str, descriptors: Any = None, **kw: Any) -> Any:
    return statequery.open(str(fixture_dir(name)), use_snapshot=False,
                           protobuf_descriptors=descriptors, **kw)


def _reading_class(name: str) -> Any:
    fds = descriptor_pb2.FileDescriptorSet.FromString(_descriptors(name).read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("statequery.proto.Reading"))


def _oracle(name: str) -> dict[tuple[str, str, str | None], dict[str, Any]]:
    """The oracle's messages, each decoded independently with ``MessageToDict``."""
    cls = _reading_class(name)
    out = {}
    for e in read_jsonl(FIXTURES / "dump" / f"{name}.jsonl"):
        if e["operator_uid"] not in (OP, "") or e["state"] not in ("reading", "readings"):
            continue
        msg = cls.FromString(base64.b64decode(e["value"]["bytes"]["$bytes"]))
        out[(e["state"], e["key"], e.get("user_key"))] = json_format.MessageToDict(
            msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return out


def _json(value: Any, d: Any) -> dict[str, Any]:
    """statequery's struct value in protobuf's JSON mapping (as ``MessageToDict`` gives it)."""
    out: dict[str, Any] = {}
    for f in d.fields:
        v = value[f.name]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = {str(k): _scalar(x, vf) for k, x in v}
        elif f.is_repeated:
            out[f.name] = [_scalar(x, f) for x in v]
        elif v is not None:
            out[f.name] = _scalar(v, f)
    return out


def _scalar(v: Any, f: Any) -> Any:
    if f.type == FD.TYPE_MESSAGE:
        if f.message_type.full_name == "google.protobuf.Timestamp":
            nanos = v.value if hasattr(v, "value") else None
            ts = timestamp_pb2.Timestamp(seconds=nanos // 10**9, nanos=nanos % 10**9)
            return ts.ToJsonString()
        return _json(v, f.message_type)
    if f.type in _64:
        return str(v)
    if f.type == FD.TYPE_BYTES:
        return base64.b64encode(v).decode("ascii")
    if f.type == FD.TYPE_FLOAT:
        return _float32(v)
    return v


def _float32(v: Any) -> Any:
    import struct

    return struct.unpack("<f", struct.pack("<f", float(v)))[0] if isinstance(v, float) else v


@pytest.mark.parametrize("name", PROTO + PROTO_1X)
def test_protobuf_values_equal_the_oracle(name: str, decode_path: str) -> None:
    want = _oracle(name)
    assert len(want) == 8 + 24
    d = _reading_class(name).DESCRIPTOR
    with _open(name, _descriptors(name)) as sp:
        got: dict[tuple[str, str, str | None], dict[str, Any]] = {}
        for state in ("reading", "readings"):
            t = sp.read(OP, state)
            assert pa.types.is_struct(t.schema.field("value").type)
            assert t.schema.field("value").metadata[b"statequery.decoding"] == b"protobuf"
            # no value stays raw
            assert t.column("value_raw").null_count == t.num_rows
            assert t.column("value_reason").null_count == t.num_rows
            for r in t.to_pylist():
                got[(state, r["key"], r.get("user_key"))] = _json(r["value"], d)
        assert got.keys() == want.keys()
        for entry, expected in want.items():
            mine = got[entry]
            expected = dict(expected, fl=_float32(expected["fl"]))
            assert mine == expected, entry
        meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()}
        for state in ("reading", "readings"):
            assert meta[state]["value_decoding"] == "protobuf"
            assert meta[state]["value_decoding_hint"] is None
        # the edge values, as read
        rows = {r["key"]: r["value"] for r in sp.read(OP, "reading").to_pylist()}
    assert rows["k0"]["name"] == "" and rows["k0"]["point"] is None and rows["k0"]["tags"] == []
    assert rows["k1"]["u64"] == 2**64 - 1 and rows["k1"]["i64"] == 2**63 - 1
    assert rows["k2"]["sf64"] == -(2**63) and rows["k2"]["level"] == "BELOW"
    assert rows["k2"]["maybe"] == 0 and rows["k1"]["maybe"] is None
    assert rows["k3"]["name"].startswith("non-BMP \U0001f600") and rows["k3"]["points"] == []
    assert rows["k5"]["counts"][0] == ("", -(2**31))


@pytest.mark.parametrize("name", PROTO + PROTO_1X)
def test_without_descriptors_values_are_raw_bytes_naming_the_option(name: str) -> None:
    with _open(name) as sp:
        t = sp.read(OP, "reading")
        assert t.schema.field("value").type == pa.binary() and "value_raw" not in t.column_names
        for reason in t.column("value_reason").to_pylist():
            assert "protobuf_descriptors=" in reason and "--protobuf-descriptors" in reason
        meta = {r["state_name"]: r for r in sp.state_meta().to_pylist()}
        for state in ("reading", "readings"):
            assert meta[state]["value_decoding"] == "raw"
            assert "protobuf_descriptors=" in meta[state]["value_decoding_hint"]
            assert "--protobuf-descriptors" in meta[state]["value_decoding_hint"]


def test_bad_bytes_stay_raw_never_a_wrong_value() -> None:
    """A length prefix that does not match, bytes that do not parse, a truncation: each is a
    failure with the reason, never a value."""
    name = PROTO[0]
    with _open(name) as sp:
        spec = sp.state(OP, "reading").value
        values = sp.read(OP, "reading").column("value").to_pylist()
    codec = kryo_codec(spec, user_types(None, _descriptors(name)))
    assert codec is not None
    for data in values:
        assert isinstance(codec.decode(data), dict)
        # Kryo's class id and reference marker, then chill-protobuf's varint length
        assert data[2] == len(data) - 3 or data[2] & 0x80
        for cut in range(3, len(data)):
            with pytest.raises(KryoUndecodable):
                codec.decode(data[:cut])
        with pytest.raises(KryoUndecodable, match="bytes left after the value"):
            codec.decode(data + b"\x00")
    longest = max((v for v in values if v[2] < 0x80), key=len)  # a one-byte length prefix
    assert len(longest) > 10
    with pytest.raises(KryoUndecodable, match="exceeds"):
        codec.decode(longest[:2] + bytes([longest[2] + 1]) + longest[3:])
    bad = longest[:3] + b"\xff" * (len(longest) - 3)  # no protobuf message
    with pytest.raises(KryoUndecodable, match="no statequery.proto.Reading message"):
        codec.decode(bad)


def test_explicit_message_mapping_and_option_errors(tmp_path: Path) -> None:
    name = PROTO[1]
    desc = _descriptors(name)
    with _open(name, desc, protobuf_messages={CLASS: "statequery.proto.Reading"}) as sp:
        assert sp.read(OP, "reading").column("value_reason").null_count == 8
    # a class mapped to another message: Point does not know Reading's fields (never a value)
    with _open(name, desc, protobuf_messages={CLASS: "statequery.proto.Point"}) as sp:
        t = sp.read(OP, "reading")
        assert [f.name for f in t.schema.field("value").type] == ["x", "y", "label"]
        rows = {r["key"]: r for r in t.to_pylist()}
        # k0's message is empty: the default of any message
        assert rows.pop("k0")["value"] == {"x": 0.0, "y": 0.0, "label": ""}
        for r in rows.values():
            assert r["value"] is None and r["value_raw"]
            assert "statequery.proto.Point does not know" in r["value_reason"]
    with pytest.raises(InvalidOptionError, match="no message nope.Nope"):
        _open(name, desc, protobuf_messages={CLASS: "nope.Nope"})
    with pytest.raises(InvalidOptionError, match="expected CLASS=proto.full.Name"):
        _open(name, desc, protobuf_messages=["no-equals-sign"])
    (tmp_path / "x.pb").write_bytes(b"\xff\xff\xff")
    with pytest.raises(InvalidOptionError, match="is not a FileDescriptorSet"):
        _open(name, tmp_path / "x.pb")
    with pytest.raises(InvalidOptionError, match="nope.pb"):
        _open(name, tmp_path / "nope.pb")


def test_cli_protobuf_descriptors(tmp_path: Path) -> None:
    name = PROTO[1]
    cmd = [sys.executable, "-m", "statequery.cli", "read", str(fixture_dir(name)), "--operator",
           OP, "--state", "reading", "--key", "k1", "--json"]
    ok = subprocess.run([*cmd, "--protobuf-descriptors", str(_descriptors(name))],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    row = json.loads(ok.stdout.strip().splitlines()[0])
    assert row["value"]["name"] == "max" and row["value"]["level"] == "HIGH"
    without = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert without.returncode == 0
    assert "--protobuf-descriptors" in json.loads(without.stdout.strip().splitlines()[0])[
        "value_reason"]
    bad = subprocess.run([*cmd, "--protobuf-descriptors", str(tmp_path / "missing.pb")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "missing.pb" in bad.stderr


def test_spark_option_and_attach_carry_the_descriptors() -> None:
    """The Spark option ``protobuf_descriptors`` and ``attach(protobuf_descriptors=...)`` reach
    the read as the option ``protobuf_descriptors`` (what every worker opens the savepoint
    with), never as a classpath entry."""
    from statequery.spark import ReadOptions
    from statequery.spark.catalog import attach_plans

    name = PROTO[1]
    path, desc = str(fixture_dir(name)), str(_descriptors(name))
    opts = ReadOptions.parse({"path": path, "operator": OP, "state": "reading",
                              "protobuf_descriptors": desc})
    assert opts.protobuf_descriptors == desc and opts.classpath is None
    from statequery.spark.resolve import _open

    sp, _, _ = _open(opts, fresh=True)
    t = sp.read(OP, "reading")
    assert t.column("value_reason").null_count == 8
    assert t.column("value").to_pylist()[0]["name"] is not None
    [plan] = attach_plans(path, "proto_types", protobuf_descriptors=desc)
    assert all(f"protobuf_descriptors '{desc}'" in s and "classpath" not in s
               for s in plan.create_tables())
    with pytest.raises(InvalidOptionError, match="missing.pb"):
        ReadOptions.parse({"path": path, "protobuf_descriptors": desc + "/missing.pb"})


def test_a_catalog_database_with_its_descriptors_is_read_with_them(tmp_path: Path) -> None:
    """A catalog database folder that holds ``descriptors.pb`` beside its savepoint (the layout
    of the types-protobuf fixtures): SQL over it (DuckDB) sees the messages as structs, and
    attaching the catalog to Spark stores the descriptors in the tables' options."""
    (tmp_path / "proto_types").symlink_to(FIXTURES / PROTO[0])
    t = statequery.sql(
        "SELECT key, value.name AS n, value.level AS l, value.u64 AS u, value_reason "
        "FROM proto_types.proto_types__reading ORDER BY key", catalog=str(tmp_path))
    rows = t.to_pylist()
    assert [r["n"] for r in rows[:3]] == ["", "max", "min"]
    assert [r["l"] for r in rows[:3]] == ["LEVEL_UNSPECIFIED", "HIGH", "BELOW"]
    assert rows[1]["u"] == 2**64 - 1
    assert all(r["value_reason"] is None for r in rows)
    from statequery.spark.catalog import attach_plans

    [plan] = attach_plans(str(tmp_path))
    desc = str(tmp_path / "proto_types" / "descriptors.pb")
    assert all(f"protobuf_descriptors '{desc}'" in s for s in plan.create_tables())


def test_mutated_messages_decode_or_stay_raw_never_crash() -> None:
    """Seeded byte flips, insertions and deletions of every fixture value: each row is a value
    of the Arrow type or raw with a reason, never an exception."""
    import random

    from statequery.arrow.kryo import _column

    name = PROTO[0]
    rng = random.Random(32)
    with _open(name) as sp:
        for state in ("reading", "readings"):
            spec = sp.state(OP, state).value
            values = sp.read(OP, state).column("value").to_pylist()
            codec = kryo_codec(spec, user_types(None, _descriptors(name)))
            assert codec is not None
            mutated: list[bytes | None] = []
            for data in values:
                for _ in range(100):
                    b = bytearray(data)
                    for _ in range(rng.randint(1, 3)):
                        op = rng.randrange(3)
                        i = rng.randrange(len(b) + (op == 1)) if b else 0
                        if op == 0 and b:
                            b[i] ^= 1 << rng.randrange(8)
                        elif op == 1:
                            b.insert(i, rng.randrange(256))
                        elif b:
                            del b[i]
                    mutated.append(bytes(b))
            arr, reasons, raw = _column(codec, codec.arrow_type(), mutated, "Kryo")
            assert len(arr) == len(mutated)
            for i, why in enumerate(reasons.to_pylist()):
                # a null (Kryo's class id 0, nothing after) is the one value that is no struct
                assert (why is None) == (arr[i].is_valid or mutated[i] == b"\x00")
                assert (why is None) == (raw[i].as_py() is None)
            assert arr.null_count > 0 and arr.null_count < len(mutated)


def test_read_through_a_statemeta_snapshot(tmp_path: Path) -> None:
    """The registrations survive a StateMeta snapshot: opened with it, the messages decode."""
    name = PROTO[1]
    loc = str(tmp_path / "meta.msgpack")
    with _open(name) as sp:
        sp.write_snapshot(loc)
    with statequery.open(str(fixture_dir(name)), snapshot=loc,
                         protobuf_descriptors=_descriptors(name)) as sp:
        t = sp.read(OP, "readings")
        assert t.num_rows == 24 and t.column("value_reason").null_count == 24
