"""The fixture oracle agrees with the fixture model.

For every fixture in ``tests/fixtures/manifest.json`` two independent descriptions of the state
exist (docs/fixtures.md):

* ``expected/<name>.jsonl`` -- computed in Python from the job's deterministic input;
* ``dump/<name>.jsonl`` -- read back from the savepoint by Flink's own state backends
  (``examples/flink-jobs/src/statequery/fixtures/SavepointDump.java``).

They must hold exactly the same entries. Only ``key_group`` (dump only) is dropped before the
comparison. A missing manifest or file is a failure, never a skip.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.entries import mask_any

FIXTURES = Path(__file__).parents[1] / "fixtures"
MANIFEST = FIXTURES / "manifest.json"
MISSING_MANIFEST = "<tests/fixtures/manifest.json missing>"
SHOW = 12  # differing entries shown per side on failure


def _manifest() -> dict[str, Any]:
    with open(MANIFEST, encoding="utf-8") as f:
        return json.load(f)  # type: ignore[no-any-return]


def _fixture_names() -> list[str]:
    # Collection must not turn a missing manifest into an empty (skipped) parameter set.
    try:
        # the changelog state backend's checkpoints have their own list (not in the other
        # fixture suites), and a model and a dump as every fixture
        m = _manifest()
        names = [r["name"] for r in m["fixtures"] + m.get("changelog", [])]
    except (OSError, ValueError, KeyError, TypeError):
        return [MISSING_MANIFEST]
    return names or [MISSING_MANIFEST]


def _record(name: str) -> dict[str, Any]:
    if name == MISSING_MANIFEST:
        pytest.fail(f"{MANIFEST} is missing, unreadable or lists no fixtures")
    m = _manifest()
    for r in m["fixtures"] + m.get("changelog", []):
        if r["name"] == name:
            return r  # type: ignore[no-any-return]
    raise AssertionError(f"fixture {name} vanished from the manifest")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    assert path.is_file(), f"missing {path}"
    entries = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    entries.append(json.loads(line))
                except ValueError as e:
                    raise AssertionError(f"{path}:{lineno}: not JSON: {e}") from None
    return entries


def _canon(entry: dict[str, Any]) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


def _strip_key_group(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "key_group"}


def _diff_report(name: str, expected: list[str], dumped: list[str]) -> str:
    exp_c, dump_c = Counter(expected), Counter(dumped)
    only_expected = sorted((exp_c - dump_c).elements())
    only_dump = sorted((dump_c - exp_c).elements())
    lines = [
        f"fixture {name}: expected ({len(expected)} entries) and Flink dump ({len(dumped)} entries)"
        f" differ: {len(only_expected)} only in expected, {len(only_dump)} only in dump",
    ]
    by_state: Counter[tuple[str, str]] = Counter()
    for side in (only_expected, only_dump):
        for s in side:
            e = json.loads(s)
            by_state[(e.get("operator_uid") or e.get("operator_id", "?"), e.get("state", "?"))] += 1
    if by_state:
        lines.append("differing entries per (operator, state): " + ", ".join(
            f"{op}/{st}: {n}" for (op, st), n in sorted(by_state.items())))
    if only_expected:
        lines.append(f"first entries only in expected/{name}.jsonl:")
        lines += ["  - " + s for s in only_expected[:SHOW]]
    if only_dump:
        lines.append(f"first entries only in dump/{name}.jsonl (key_group dropped):")
        lines += ["  + " + s for s in only_dump[:SHOW]]
    return "\n".join(lines)


def test_manifest_present() -> None:
    assert MANIFEST.is_file(), (
        f"{MANIFEST} is missing (regenerate: examples/flink-jobs/generate_fixtures.py)"
    )
    fixtures = _manifest()["fixtures"]
    assert fixtures, "manifest lists no fixtures"
    names = [r["name"] for r in fixtures]
    assert len(names) == len(set(names)), f"duplicate fixture names in manifest: {names}"
    # every record names the Flink release that wrote it (docs/fixtures.md, version matrix)
    unversioned = [r["name"] for r in fixtures if not r.get("flink_version")]
    assert not unversioned, f"manifest records without flink_version: {unversioned}"


@pytest.mark.parametrize("name", _fixture_names())
def test_dump_equals_expected(name: str) -> None:
    _record(name)
    expected = sorted(_canon(e) for e in _read_jsonl(FIXTURES / "expected" / f"{name}.jsonl"))
    # "$any" in an expected entry (TTL last_access: processing time) matches any integer there
    dumped = sorted(
        _canon(e)
        for e in mask_any(
            [_strip_key_group(e) for e in _read_jsonl(FIXTURES / "dump" / f"{name}.jsonl")],
            _read_jsonl(FIXTURES / "expected" / f"{name}.jsonl"),
        )
    )
    assert dumped, f"dump/{name}.jsonl is empty"
    if _record(name).get("expected") == "subset":
        # SQL operator fixtures: the model covers the operators whose state follows from the
        # input alone (docs/fixtures.md); each of its entries must be in Flink's restore
        assert expected, f"expected/{name}.jsonl is empty"
        missing = sorted((Counter(expected) - Counter(dumped)).elements())
        if missing:
            pytest.fail(f"fixture {name}: {len(missing)} expected entries are not in the dump:\n"
                        + "\n".join("  - " + m for m in missing[:SHOW]), pytrace=False)
    elif expected != dumped:
        pytest.fail(_diff_report(name, expected, dumped), pytrace=False)


@pytest.mark.parametrize("name", _fixture_names())
def test_dump_covers_manifest(name: str) -> None:
    record = _record(name)
    dump = _read_jsonl(FIXTURES / "dump" / f"{name}.jsonl")
    assert dump, f"dump/{name}.jsonl is empty"
    max_par = record.get("max_parallelism")

    seen: dict[tuple[str, str], set[str]] = {}
    for e in dump:
        for field in ("operator_uid", "operator_id", "state", "kind"):
            assert field in e, f"dump entry without {field}: {_canon(e)}"
        seen.setdefault((e["operator_id"], e["state"]), set()).add(e["kind"])
        if "key" in e:  # keyed entries carry Flink's key group
            kg = e.get("key_group")
            assert isinstance(kg, int), f"keyed dump entry without key_group: {_canon(e)}"
            if isinstance(max_par, int):
                assert 0 <= kg < max_par, f"key_group {kg} outside [0, {max_par}): {_canon(e)}"

    # Every state the manifest declares and the model fills must appear in the dump (a declared
    # state that is empty in the snapshot, e.g. the processing-time timers of an event-time window,
    # has no entries on either side); and the dump must not hold states the manifest omits.
    expected_states = {(e["operator_id"], e["state"])
                       for e in _read_jsonl(FIXTURES / "expected" / f"{name}.jsonl")}
    ops = record.get("operators") or []
    assert ops, f"manifest record {name} lists no operators"
    declared: dict[tuple[str, str], str] = {}
    for op in ops:
        for st in op.get("states") or []:  # operators without state (sinks) list none
            declared[(op["operator_id"], st["name"])] = st["kind"]
    label = {op["operator_id"]: op.get("uid") or op["operator_id"] for op in ops}
    missing = sorted(f"{label[o]}/{s}" for (o, s) in declared
                     if (o, s) not in seen and (o, s) in expected_states)
    wrong_kind = sorted(f"{label[o]}/{s}: manifest {k}, dump {sorted(seen[(o, s)])}"
                        for (o, s), k in declared.items() if (o, s) in seen and seen[(o, s)] != {k})
    undeclared = sorted(f"{label.get(o, o)}/{s}" for (o, s) in seen if (o, s) not in declared)
    assert not missing, f"fixture {name}: the dump has no entries for {missing}"
    assert not wrong_kind, f"fixture {name}: kind mismatch {wrong_kind}"
    assert not undeclared, (
        f"fixture {name}: the dump holds states the manifest does not declare: {undeclared}"
    )

    # The uid recorded in the dump (from _metadata) matches the manifest.
    uid_by_id = {op["operator_id"]: op.get("uid", "") for op in ops}
    for e in dump:
        if e["operator_id"] in uid_by_id and uid_by_id[e["operator_id"]]:
            assert e["operator_uid"] == uid_by_id[e["operator_id"]], f"uid mismatch: {_canon(e)}"


@pytest.mark.parametrize("name", _fixture_names())
def test_files_are_canonical_jsonl(name: str) -> None:
    """Both files hold sorted lines, each ``json.dumps(sort_keys=True, separators=(",", ":"))``."""
    _record(name)
    for kind in ("dump", "expected"):
        path = FIXTURES / kind / f"{name}.jsonl"
        assert path.is_file(), f"missing {path}"
        text = path.read_text(encoding="utf-8")
        assert text.endswith("\n"), f"{path}: no final newline"
        lines = text[:-1].split("\n")
        for i, line in enumerate(lines, 1):
            assert line == _canon(json.loads(line)), f"{path}:{i}: not canonical JSON: {line}"
        assert lines == sorted(lines), f"{path}: lines are not sorted"
