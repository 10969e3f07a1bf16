"""The series fixtures (manifest ``series``): several snapshots of one job run, in order
(``sequence-rocksdb-incremental-chk-1`` .. ``-chk-3`` retained RocksDB incremental checkpoints and
``-savepoint``, a canonical savepoint taken after them). docs/fixtures.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parents[1] / "fixtures"
SEQUENCE = "sequence-rocksdb-incremental"
SNAPSHOTS = ("chk-1", "chk-2", "chk-3", "savepoint")
#: records the snapshot holds (the job gates its source to 100 records per checkpoint)
RECORDS = {"chk-1": 100, "chk-2": 200, "chk-3": 300, "savepoint": 400}
#: identity fields of a fixture entry (docs/fixtures.md)
IDENTITY = ("operator_id", "state", "key", "namespace", "user_key", "timestamp", "subtask",
            "index")


def series_records() -> list[dict[str, Any]]:
    with open(FIXTURES / "manifest.json", encoding="utf-8") as f:
        records = json.load(f)["series"]
    assert records, "the manifest lists no series fixtures"
    return records  # type: ignore[no-any-return]


def series_record(snapshot: str, series: str = SEQUENCE) -> dict[str, Any]:
    name = f"{series}-{snapshot}"
    for r in series_records():
        if r["name"] == name:
            return r
    raise AssertionError(f"no series fixture {name} in the manifest")


def series_dir(snapshot: str, series: str = SEQUENCE) -> Path:
    return FIXTURES / series_record(snapshot, series)["path"]


def series_dump(snapshot: str, series: str = SEQUENCE) -> list[dict[str, Any]]:
    path = FIXTURES / "dump" / f"{series}-{snapshot}.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def identity(entry: dict[str, Any]) -> str:
    return canonical({k: entry.get(k) for k in IDENTITY})
