"""Hostile Java serialization streams (statequery.metadata.javaser, issue 31 item 5): every
crafted stream is a typed error or a value, never a RecursionError, KeyError or IndexError, and
``statequery inspect`` on a change-log checkpoint carrying one prints a one-line typed error."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from conftest import FIXTURES, load_manifest
from hypothesis import given, settings
from hypothesis import strategies as st

from statequery.decoder import Decoder
from statequery.exceptions import CorruptStateError, UnsupportedFormatError
from statequery.metadata.javaser import JavaEnum, read_object, read_ttl_config

HEADER = b"\xac\xed\x00\x05"
TYPED = (CorruptStateError, UnsupportedFormatError)


def _desc(name: str, flags: int = 0x02) -> bytes:
    """TC_CLASSDESC of a class without fields, no annotation, no super class."""
    raw = name.encode()
    return b"\x72" + struct.pack(">H", len(raw)) + raw + bytes(8) + bytes([flags]) + b"\x00\x00" \
        + b"\x78\x70"


def _string(s: str) -> bytes:
    return b"\x74" + struct.pack(">H", len(s)) + s.encode()


RESETS = HEADER + b"\x79" * 5000 + b"\x70"
# an enum whose name is an enum whose name is an enum ... (5,000 links), each reusing the first
# class descriptor by reference (handle 0)
CHAINED_ENUMS = HEADER + b"\x7e" + _desc("E", 0x12) + b"\x7e\x71\x00\x7e\x00\x00" * 5000 \
    + _string("A")
ARRAY_OF_X = HEADER + b"\x75" + _desc("[X") + b"\x00\x00\x00\x01\x00"
RESET_IN_ARRAY = HEADER + b"\x75" + _desc("[Ljava.lang.Object;") + b"\x00\x00\x00\x01\x79\x70"
RESET_IN_ENUM_NAME = HEADER + b"\x7e" + _desc("E", 0x12) + b"\x79" + _string("A")


def _read(data: bytes) -> object:
    return read_object(Decoder(data, source="crafted"))


def test_a_run_of_resets_is_a_loop_and_well_formed_streams_parse() -> None:
    # before: one Python frame per TC_RESET, RecursionError
    assert _read(RESETS) is None
    with pytest.raises(CorruptStateError, match="a StateTtlConfig expected"):
        read_ttl_config(Decoder(RESETS, source="crafted"))


@pytest.mark.parametrize(("data", "match"), [
    (CHAINED_ENUMS, "enum constant's name is not a string"),  # before: RecursionError
    (ARRAY_OF_X, r"array of class '\[X'"),  # before: KeyError
    (RESET_IN_ARRAY, "reset"),  # before: IndexError
    (RESET_IN_ENUM_NAME, "enum constant's name is not a string"),  # before: IndexError
], ids=["chained-enums", "array-of-X", "reset-in-array", "reset-in-enum-name"])
def test_crafted_streams_are_typed_errors(data: bytes, match: str) -> None:
    with pytest.raises(CorruptStateError, match=match) as e:
        _read(data)
    assert "crafted" in str(e.value)
    # ... while well-formed enums, arrays and resets between objects still parse
    enum = _read(HEADER + b"\x7e" + _desc("E", 0x12) + _string("A"))
    assert enum == JavaEnum("E", "A")
    arr = _read(HEADER + b"\x75" + _desc("[I") + b"\x00\x00\x00\x02" + struct.pack(">ii", 7, -1))
    assert arr.values == (7, -1)  # type: ignore[attr-defined]
    # a reset between top-level objects is allowed (ObjectOutputStream.reset())
    assert _read(HEADER + b"\x79\x79" + _string("s")) == "s"
    # an enum constant named by a reference to an earlier string
    two = _read(HEADER + b"\x75" + _desc("[Ljava.lang.Object;") + b"\x00\x00\x00\x02"
                + b"\x7e" + _desc("E", 0x12) + _string("A")
                + b"\x7e\x71\x00\x7e\x00\x02\x71\x00\x7e\x00\x04")
    assert two.values == (JavaEnum("E", "A"), JavaEnum("E", "A"))  # type: ignore[attr-defined]


# tokens of the grammar: tags, class descriptors, lengths and handles
_TOKENS = [bytes([t]) for t in range(0x70, 0x7F)] + [
    _desc("E", 0x12), _desc("[X"), _desc("[I"), _desc("[L"), _desc("P", 0x03), _desc("X", 0x0C),
    _string("A"), b"\x00\x00\x00\x01", b"\x00\x00\x00\x02", b"\x00\x7e\x00\x00",
    b"\x00\x7e\x00\x01", b"\x00\x01", b"\x78", b"\x00", b"\xff\xff\xff\xff",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=60), st.integers(0, 3000))
def test_any_token_stream_is_typed(tokens: list[bytes], resets: int) -> None:
    """Streams assembled from the grammar's pieces (and long runs of resets): a value or a
    typed error, nothing else."""
    for data in (HEADER + b"".join(tokens), HEADER + b"\x79" * resets + b"".join(tokens)):
        try:
            _read(data)
        except TYPED:
            pass


def _ttl_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the TTL change-log fixture (its root, its checkpoint directory) and the
    change-log file holding the Java-serialized StateTtlConfigs."""
    rec = next(r for r in load_manifest()["changelog"]
               if r["name"] == "changelog-ttl-hashmap-checkpoint")
    src = FIXTURES / rec["path"].split("/")[0]
    root = tmp_path / "c"
    shutil.copytree(src, root)
    logs = [p for p in root.rglob("*") if p.parent.name == "dstl" and HEADER in p.read_bytes()]
    assert logs
    return root / Path(rec["path"]).relative_to(rec["path"].split("/")[0]), logs[0]


@pytest.mark.parametrize("attack", [ARRAY_OF_X, RESET_IN_ARRAY],
                         ids=["array-of-X", "reset-in-array"])
def test_inspect_of_a_hostile_ttl_config_names_a_typed_error(
        tmp_path: Path, attack: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    """The attack overwrites the start of a StateTtlConfig in place (the log's lengths and
    offsets stay): before, ``inspect`` failed with "unexpected error ... KeyError/IndexError";
    now it lists the states, each saying why it cannot be read (the typed error, naming the
    change-log file)."""
    import json

    from statequery.cli import main

    path, log = _ttl_checkpoint(tmp_path)
    data = bytearray(log.read_bytes())
    at = data.index(HEADER)
    data[at:at + len(attack)] = attack
    log.write_bytes(bytes(data))
    assert main(["inspect", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "unexpected error" not in captured.err and "Traceback" not in captured.err
    text = captured.out
    assert "Java serialization" in text and log.name in text
    assert "KeyError" not in text and "IndexError" not in text
    json.loads(text)
    # reading one of its states: the one-line typed error
    assert main(["read", str(path), "ttl__ttl_count"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "unexpected error" not in err
    assert err.startswith("statequery: ") and f"{log.name} at byte" in err
    assert "Java serialization" in err


# -- the other parsers of untrusted documents: nesting is a typed error ------------------------


def test_a_deeply_nested_plan_is_a_typed_error() -> None:
    """A compiled plan (``--plan``, or the one a StateMeta snapshot carries) nested deeper than
    json's recursion: before, RecursionError out of parse_plan; an expression of 5,000 CASTs:
    before, RecursionError out of the projection analysis."""
    from statequery.exceptions import InvalidOptionError
    from statequery.metadata.plan import _passes, _value_ref, parse_plan

    with pytest.raises(InvalidOptionError, match="not JSON"):
        parse_plan('{"nodes": [], "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "deep.json")
    expr: dict[str, object] = {"kind": "INPUT_REF", "inputIndex": 3}
    for _ in range(5000):
        expr = {"kind": "CALL", "internalName": "$CAST$1", "operands": [expr]}
    assert _value_ref(expr) == 3
    assert _passes(expr, 3) is None  # deeper than any planner writes: not followed


def test_a_deeply_nested_statemeta_snapshot_is_ignored(tmp_path: Path) -> None:
    """A StateMeta snapshot whose document nests 1,000 maps in a serializer spec (msgpack
    allows 1,024; the checksum is a digest anyone can recompute): before, RecursionError out of
    Savepoint.open; now the snapshot is malformed, ignored with a warning, the model derived."""
    import hashlib

    import msgpack
    from conftest import fixture_dir

    import statequery
    from statequery.exceptions import SnapshotIgnoredWarning
    from statequery.metadata import statemeta
    from statequery.metadata.statemeta import SNAPSHOT_FILE_NAME

    src = fixture_dir("pyflink-thread-hashmap-canonical")
    sp_dir = tmp_path / "sp"
    shutil.copytree(src, sp_dir)
    statequery.open(str(sp_dir), use_snapshot=False).write_snapshot()
    snap = sp_dir / SNAPSHOT_FILE_NAME
    envelope = msgpack.unpackb(snap.read_bytes(), raw=False, strict_map_key=False)
    doc = msgpack.unpackb(envelope["body"], raw=False, strict_map_key=False)
    todo, spec = [doc], None
    while todo and spec is None:  # the first serializer spec in the document
        v = todo.pop()
        if isinstance(v, dict):
            spec = v if "$kind" in v else None
            todo += list(v.values())
        elif isinstance(v, list):
            todo += v
    assert spec is not None
    spec["deep"] = "__DEEP__"
    body = msgpack.packb(doc, use_bin_type=True)
    deep = b"\x81\xa1a" * 1000 + b"\xc0"  # {"a": {"a": ... None}} (msgpack's packer stops at 512)
    body = body.replace(msgpack.packb("__DEEP__"), deep)
    envelope["body"], envelope["sha256"] = body, hashlib.sha256(body).hexdigest()
    snap.write_bytes(msgpack.packb(envelope, use_bin_type=True))
    with pytest.raises(CorruptStateError, match="malformed StateMeta snapshot: RecursionError"):
        statemeta.loads(snap.read_bytes())
    with pytest.warns(SnapshotIgnoredWarning):
        sp = statequery.open(str(sp_dir))
    assert not sp.from_snapshot and sp.read("py-typed", "count").num_rows == 6


def test_a_deeply_nested_rest_answer_is_a_capture_error(tmp_path: Path) -> None:
    """Flink's REST API answering JSON nested past json's recursion, or an errors map: before,
    RecursionError / KeyError out of ``statequery capture``; now CaptureError."""
    from support.loopback import static_http_server

    from statequery.capture import CaptureError, HttpRest, _rest_error

    (tmp_path / "deep").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with static_http_server(str(tmp_path), lifetime=60) as server:
        with pytest.raises(CaptureError, match="the answer is not JSON"):
            HttpRest(server.url, timeout=10).get("/deep")
    assert _rest_error(b'{"errors": {"a": 1}}') == '{"errors": {"a": 1}}'
    assert _rest_error(b'{"errors": ' + b"[" * 100_000 + b"]" * 100_000 + b"}").startswith(
        '{"errors": [[[')


def test_nested_changelog_handles_are_a_typed_error() -> None:
    """A _metadata whose changelog state handle holds a changelog state handle holding one ...
    (21 bytes a level): before, the parser recursed once per level (RecursionError); Flink
    never nests them, so a nested one is a CorruptStateError at once."""
    from statequery.metadata.checkpoint import CHANGELOG_HANDLE, NULL_HANDLE, _MetadataParser

    level = bytes([CHANGELOG_HANDLE]) + struct.pack(">iiqi", 0, 1, 0, 1)
    data = level * 5000 + bytes([NULL_HANDLE])
    with pytest.raises(CorruptStateError, match="changelog state handle inside a changelog") as e:
        _MetadataParser(Decoder(data, source="crafted"), 3)._keyed_handle()
    assert "crafted at byte 21" in str(e.value)
    # one level, as Flink writes it: parsed (no parts, ids after them)
    one = level[:-4] + struct.pack(">i", 0) + struct.pack(">i", 0) + struct.pack(">q", 7) \
        + struct.pack(">H", 2) + b"id"
    h = _MetadataParser(Decoder(one, source="crafted"), 3)._keyed_handle()
    assert h.materialization_id == 7 and h.handle_id == "id"  # type: ignore[union-attr]
