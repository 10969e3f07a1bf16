"""FLIP-27 source splits decoded into typed rows, checked against the job that wrote them.

The series fixture's source is a DataGeneratorSource over 0..999 (one NumberSequenceSplit "1",
parallelism 1) gated to 100 records per checkpoint: snapshot n holds records 0..100n-1, so the
split's position (``from``, the next number to emit) is 100n and ``to`` is 999."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from support.series import RECORDS, series_dir

import statequery
from statequery.exceptions import CorruptStateError, InvalidOptionError, NoSuchStateError
from statequery.sources import (
    decode_enumerator,
    decode_split,
    source_enumerator,
    source_splits,
)
from tests.conftest import fixture_dir


@pytest.mark.parametrize("snapshot", list(RECORDS))
def test_number_sequence_split_position_is_what_the_job_emitted(snapshot: str) -> None:
    sp = statequery.open(str(series_dir(snapshot)))
    splits = source_splits(sp, "sequence-source")
    assert splits.to_pylist() == [
        {"subtask": 0, "index": 0, "source": "number_sequence", "serializer_version": 1,
         "split_id": "1", "from": RECORDS[snapshot], "to": 999}
    ]
    # named explicitly, the same
    assert source_splits(sp, "sequence-source", source="number_sequence").equals(splits)


@pytest.mark.parametrize("fixture", ["datastream-hashmap-canonical", "datastream-rocksdb-native"])
def test_the_catalog_jobs_own_source_is_decoded(fixture: str) -> None:
    # the DataStream fixture's (and the shipped catalog's) own source, FixtureSplitSerializer:
    # writeUTF(id), writeLong(next); split-k covers events [100k, 100k + 100) and the job had
    # emitted all 200 when the savepoint was taken
    sp = statequery.open(str(fixture_dir(fixture)))
    assert source_splits(sp, "fixture-source").to_pylist() == [
        {"subtask": 0, "index": i, "source": "fixture", "serializer_version": 1,
         "split_id": f"split-{i}", "next": 100 * (i + 1)}
        for i in range(2)
    ]


def test_unknown_layouts_are_refused_not_guessed() -> None:
    from statequery.sources import _recognise

    # version 1, 4 bytes: a number sequence split is longer, a fixture split too
    with pytest.raises(InvalidOptionError, match="no known layout fits"):
        _recognise([struct.pack(">ii", 1, 4) + b"abcd"], "a source")
    sp = statequery.open(str(fixture_dir("datastream-hashmap-canonical")))
    with pytest.raises(CorruptStateError, match="kafka split serializer version 1"):
        source_splits(sp, "fixture-source", source="kafka")
    # named wrongly: the bytes end before a number sequence split would, and the error says where
    with pytest.raises(CorruptStateError, match=r"fixture-source/SourceReaderState \(subtask 0"):
        source_splits(sp, "fixture-source", source="number_sequence")
    with pytest.raises(NoSuchStateError, match="not a FLIP-27 source"):
        source_splits(sp, "user-state")
    with pytest.raises(InvalidOptionError, match="unknown source kind"):
        source_splits(sp, "fixture-source", source="pulsar")


def _utf(s: str) -> bytes:
    return struct.pack(">H", len(s)) + s.encode()


def _string_value(s: str) -> bytes:
    return bytes([len(s) + 1]) + s.encode()


def test_file_split_layout() -> None:
    # FileSourceSplitSerializer v1 as Flink 2.3 writes it (read with javap from
    # flink-connector-files-2.3.0.jar); no file-source fixture yet
    path = (b"\x01" + b"\x01" + _string_value("file") + b"\x00" + b"\x00" + struct.pack(">i", -1)
            + b"\x01" + _string_value("/data/in/part-0.txt") + b"\x00" + b"\x00")
    payload = (_utf("0000000001") + path + struct.pack(">qqqq", 0, 4096, 1700000000000, 4096)
               + struct.pack(">i", 1) + _utf("localhost") + b"\x01" + struct.pack(">qq", 1024, 3))
    data = struct.pack(">ii", 1, len(payload)) + payload
    assert decode_split(data, "file") == (1, {
        "split_id": "0000000001", "path": "file:/data/in/part-0.txt", "offset": 0,
        "length": 4096, "file_modification_time": 1700000000000, "file_size": 4096,
        "hostnames": ["localhost"], "reader_offset": 1024, "records_after_offset": 3,
    })
    with pytest.raises(CorruptStateError):
        decode_split(data[:-1], "file")


def test_golden_split_bytes_written_by_flink_serializers() -> None:
    # tests/fixtures/splits/golden.jsonl: written by FileSourceSplitSerializer and
    # NumberSequenceSource.SplitSerializer themselves (examples/flink-jobs/.../SplitGolden.java)
    import base64
    import json

    path = Path(__file__).parents[1] / "fixtures" / "splits" / "golden.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert {d["source"] for d in lines} == {"file", "number_sequence",
                                            "number_sequence_enumerator"}
    (enumerator,) = [d for d in lines if d["source"] == "number_sequence_enumerator"]
    assert decode_enumerator(base64.b64decode(enumerator["bytes"])) == enumerator["fields"]
    lines = [d for d in lines if d is not enumerator]
    assert len(lines) == 3
    for d in lines:
        data = base64.b64decode(d["bytes"])
        assert decode_split(data, d["source"]) == (1, d["fields"])
        # and no other layout reads these bytes
        others = [k for k in ("file", "number_sequence", "kafka") if k != d["source"]]
        for other in others:
            with pytest.raises(CorruptStateError):
                decode_split(data, other)


@pytest.mark.parametrize("snapshot", list(RECORDS))
def test_enumerator_has_assigned_its_only_split(snapshot: str) -> None:
    # parallelism 1: the enumerator made one split and assigned it at start; the coordinator
    # state (in _metadata) holds an empty collection
    sp = statequery.open(str(series_dir(snapshot)))
    assert source_enumerator(sp, "sequence-source").num_rows == 0
    with pytest.raises(NoSuchStateError, match="no coordinator state"):
        source_enumerator(sp, "sequence-state")
