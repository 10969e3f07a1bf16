"""One key, found on every path: every key ``read()`` returns, given back, finds exactly its rows.

For every fixture in ``tests/fixtures/manifest.json`` (new fixtures are picked up by themselves),
every operator with keyed state and a sample of its keys (every distinct shape of key: which fields
are null, which Python types; then more with a fixed seed), on the compiled and the pure decode
paths:

* ``read(state, key=k)`` equals the full read's rows whose key is ``k``, as a table (schema, rows,
  row order), for every keyed state of the operator (states without ``k`` give an empty table);
* ``lookup(k, operator)`` gives exactly the states that hold ``k``, each with those rows (and
  ``lookup(k)`` over every operator agrees, for one key per fixture);
* the key's CLI text form (what ``read --json`` prints for it) converts to the same key (same
  serialized bytes and key group), and ``statequery read --key TEXT`` and ``statequery lookup
  TEXT`` print those rows (one key per operator).

Rows are matched to a key by ``repr`` of the key (so ``0.0`` and ``-0.0``, or ``Decimal('1.0')``
and ``Decimal('1.00')``, are different keys, as they are to Flink).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from conftest import FIXTURES, load_manifest
from support.entries import same_table

import statequery
from statequery.cli import main
from statequery.cli.output import _json_default
from statequery.keys import parse_key_text, resolve_key

SAMPLE = 3  # keys per operator beyond one of each shape
SEED = 19


def _records() -> list[dict[str, Any]]:
    m = load_manifest()
    return list(m["fixtures"]) + list(m.get("series", []))


RECORDS = {r["name"]: r for r in _records()}


def _shape(key: Any) -> str:
    """Which fields are null and the Python type of each field."""
    if isinstance(key, dict):
        return ",".join(f"{n}:{type(v).__name__}" for n, v in key.items())
    return type(key).__name__


def _sample(keys: list[Any]) -> list[Any]:
    by_shape: dict[str, Any] = {}
    for k in keys:
        by_shape.setdefault(_shape(k), k)
    chosen = list(by_shape.values())
    rest = [k for k in keys if all(repr(k) != repr(c) for c in chosen)]
    chosen += random.Random(SEED).sample(rest, min(SAMPLE, len(rest)))
    return chosen


def _cli_text(key: Any) -> str:
    if isinstance(key, str):
        return key
    return json.dumps(key, default=_json_default, ensure_ascii=False)


def _keyed_operators(sp: Any) -> Iterator[tuple[Any, list[Any]]]:
    for op in sp.keyed_operators():
        states = [s for s in op.states if s.keyed_rows]
        if states:
            yield op, states


def _assert_tables_equal(got: pa.Table, want: pa.Table, what: str) -> None:
    assert got.schema == want.schema, what
    assert got.num_rows == want.num_rows, (
        f"{what}: {got.num_rows} rows, the full read has {want.num_rows}"
    )
    # NaN-aware (Arrow's equals says NaN != NaN; edge fixtures hold NaN values and user keys)
    assert same_table(got, want), f"{what}: {got.to_pylist()} != {want.to_pylist()}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_key_read_returns_finds_exactly_its_rows(
    name: str, decode_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(FIXTURES / RECORDS[name]["path"])
    sp = statequery.open(path, use_snapshot=False)
    checked = 0
    everywhere_checked = False
    for op, states in _keyed_operators(sp):
        full = {s.name: sp.read(s) for s in states}
        reprs = {n: [repr(k) for k in t.column("key").to_pylist()] for n, t in full.items()}
        keys: dict[str, Any] = {}
        for t in full.values():
            for k in t.column("key").to_pylist():
                keys.setdefault(repr(k), k)
        sample = _sample(list(keys.values()))
        for i, key in enumerate(sample):
            r = repr(key)
            want = {
                n: t.filter(pa.array([x == r for x in reprs[n]], type=pa.bool_()))
                for n, t in full.items()
            }
            for s in states:
                got = sp.read(s, key=key)
                _assert_tables_equal(got, want[s.name], f"{name} {op.display_name}/{s.name} {r}")
            found = sp.lookup(key, op.operator_id)
            holding = {n for n, t in want.items() if t.num_rows}
            assert {st for _, st in found} == holding, f"{name} {op.display_name} {r}"
            for (_, st), table in found.items():
                _assert_tables_equal(table, want[st], f"lookup {name} {op.display_name}/{st} {r}")
            # the CLI text form is the same key
            text = _cli_text(key)
            resolved = resolve_key(key, op.key_spec, op.max_parallelism)
            from_text = resolve_key(parse_key_text(text, op.key_spec), op.key_spec,
                                    op.max_parallelism)
            assert (from_text.serialized, from_text.key_group) == (
                resolved.serialized, resolved.key_group), f"{name} {text!r}"
            if resolved.serialized is not None:
                assert resolved.key_group == want_key_group(want), f"{name} {r}"
            if i == 0 and not everywhere_checked:  # once per fixture: lookup everywhere
                everywhere_checked = True
                everywhere = sp.lookup(key)
                mine = {st: t for (label, st), t in everywhere.items()
                        if label == op.display_name}
                assert set(mine) == holding, f"{name} {op.display_name} {r}"
                for st, table in mine.items():
                    _assert_tables_equal(table, want[st], f"lookup(key) {name} {st} {r}")
            if i == 0:  # once per operator: the CLI
                s = next(s for s in states if want[s.name].num_rows)
                capsys.readouterr()
                assert main(["read", path, "--operator", op.operator_id, "--state", s.name,
                             "--key", text, "--json"]) == 0
                lines = capsys.readouterr().out.splitlines()
                assert lines == [json.dumps(row, default=_json_default, ensure_ascii=False)
                                 for row in want[s.name].to_pylist()], f"CLI {name} {text!r}"
                assert main(["lookup", path, text, "--operator", op.operator_id, "--json"]) == 0
                got_states = [json.loads(line)["state"]
                              for line in capsys.readouterr().out.splitlines()]
                assert sorted(got_states) == sorted(
                    n for n, t in want.items() for _ in range(t.num_rows)
                ), f"CLI lookup {name} {text!r}"
            checked += 1
    assert checked or not any(True for _ in _keyed_operators(sp)), name


def want_key_group(want: dict[str, pa.Table]) -> int:
    groups = {kg for t in want.values() for kg in t.column("key_group").to_pylist()}
    assert len(groups) == 1, groups
    return groups.pop()
