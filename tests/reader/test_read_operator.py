"""Several states of one operator in one pass (``Savepoint.read_operator`` / ``read_states``).

Every state read together equals the same state read alone (which the oracle tests hold equal to
Flink's own restore), on every fixture; and the one pass reads each key group once: the bytes a
multi-state read takes are those of one single-state read, not one walk per state.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import fixture_dir, fixture_names, fixture_record, fixture_records
from support.entries import same_table

import statequery
from statequery.exceptions import InvalidOptionError, NoSuchStateError
from statequery.io import FileIO
from statequery.metadata.kinds import OPERATOR_KINDS
from statequery.scan import plan_states


def _readable(sp: statequery.Savepoint) -> list[tuple[str, list[str]]]:
    out = []
    for op in sp.operators:
        names = [
            s.name
            for s in op.states
            if (s.keyed_rows or s.kind in OPERATOR_KINDS)
            and s.decodable and not s.reason
        ]
        if names:
            out.append((op.operator_id, names))
    return out


@pytest.mark.parametrize("name", fixture_names())
def test_every_state_read_together_equals_it_read_alone(name: str) -> None:
    sp = statequery.open(str(fixture_dir(name)))
    checked = 0
    for operator, names in _readable(sp):
        together = sp.read_states(operator, names)
        assert list(together) == names
        for state in names:
            alone = sp.read(operator, state)
            assert together[state].schema.equals(alone.schema), (operator, state)
            assert same_table(together[state], alone), (operator, state)
            checked += alone.num_rows
    assert checked > 0


@pytest.mark.parametrize(
    "name", [r["name"] for r in fixture_records() if r["format"] == "canonical"])
def test_key_groups_walked_in_pieces_read_the_same(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key group over twice ``WALK_PIECE_BYTES`` is walked in pieces read one after the other
    (memory holds a piece, not the key group): with 13-byte pieces, every key group of these
    fixtures but the smallest is, each entry and mark cut somewhere; every state reads the
    same rows as walked whole. (The pure path in pieces: tests/backends/test_differential.py.)"""
    from statequery.backends import keygroups

    sp = statequery.open(str(fixture_dir(name)), use_snapshot=False)
    whole = {op: sp.read_states(op, names, workers=1) for op, names in _readable(sp)}
    monkeypatch.setattr(keygroups, "WALK_PIECE_BYTES", 13)
    walked = []
    original = keygroups.KeyGroupStream._walk_in_pieces

    def counted(self: keygroups.KeyGroupStream, *args: object) -> None:
        walked.append(args[1])
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(keygroups.KeyGroupStream, "_walk_in_pieces", counted)
    pieces = statequery.open(str(fixture_dir(name)), use_snapshot=False)
    rows = 0
    for op, names in _readable(pieces):
        got = pieces.read_states(op, names, workers=1)
        for state in names:
            assert got[state].schema.equals(whole[op][state].schema), (op, state)
            assert same_table(got[state], whole[op][state]), (op, state)
            rows += got[state].num_rows
    assert rows > 0
    compressed = bool(fixture_record(name).get("compression"))
    assert compressed or walked  # key groups of uncompressed streams were walked in pieces


@pytest.mark.parametrize(
    "name",
    ["datastream-hashmap-canonical", "datastream-hashmap-native", "datastream-rocksdb-native"],
)
def test_one_key_every_state_in_one_pass_equals_lookup(name: str) -> None:
    sp = statequery.open(str(fixture_dir(name)))
    got = sp.read_states("user-state", key="user-3")
    looked = sp.lookup("user-3", operator="user-state")
    assert {state for (_, state) in looked} == {s for s, t in got.items() if t.num_rows}
    for (_, state), table in looked.items():
        assert got[state].to_pylist() == table.to_pylist()
        assert {r["key"] for r in table.to_pylist()} == {"user-3"}
    # the value states hold exactly one row for the key
    assert got["count"].num_rows == 1


def test_one_pass_reads_each_key_group_once() -> None:
    """Canonical: every keyed state of user-state together reads the bytes one state reads."""
    path = str(fixture_dir("datastream-hashmap-canonical"))
    io = FileIO()
    sp = statequery.open(path, io=io)
    keyed = [s.name for s in sp.operator_states("user-state", keyed_only=True)]
    assert len(keyed) == 8
    io.stats.reset()
    for _ in sp.read_operator("user-state", keyed):
        pass
    together = dict(io.stats.bytes_read)
    fresh_io = FileIO()
    fresh = statequery.open(path, io=fresh_io)  # no run index recorded yet: a whole walk
    fresh.operator_states("user-state")  # the headers
    fresh_io.stats.reset()
    list(fresh.read_batches("user-state", "count"))
    one = dict(fresh_io.stats.bytes_read)
    fresh_io.stats.reset()
    for state in keyed:
        list(fresh.read_batches("user-state", state))
    assert together == one
    # the first walk recorded the run index: each later single-state read reads only its runs
    # (from its state id on), so all of them together read every byte but the end marks
    marks = sum(
        2 for st in sp.operator("user-state").subtasks for o in st.keyed_handle.offsets if o > 0
    )
    assert fresh_io.stats.total_bytes == sum(one.values()) - marks


def test_pairs_stream_in_batches_with_each_states_schema() -> None:
    sp = statequery.open(str(fixture_dir("datastream-hashmap-canonical")))
    seen: dict[str, int] = {}
    for state, batch in sp.read_operator("user-state", batch_size=7):
        assert isinstance(batch, pa.RecordBatch)
        assert batch.num_rows <= 7
        assert batch.schema.equals(sp.read("user-state", state).schema)
        seen[state] = seen.get(state, 0) + batch.num_rows
    assert seen["amount-by-category"] == 80 and seen["count"] == 20
    # operator state comes along when no key is asked for
    ops = dict.fromkeys(s for s, _ in sp.read_operator("operator-state"))
    assert set(ops) == {"union-markers", "buffered-ids", "rules"}


def test_states_by_table_name_key_groups_and_errors() -> None:
    sp = statequery.open(str(fixture_dir("datastream-hashmap-canonical")))
    by_table = sp.read_states("user-state", ["user_state__count", "sum-amount"])
    assert list(by_table) == ["count", "sum-amount"]
    kg = sp.key_group_of("user-state", "user-3", "count")
    part = sp.read_states("user-state", ["count"], key_groups=[kg])["count"]
    assert part.num_rows >= 1 and set(part.column("key_group").to_pylist()) == {kg}
    with pytest.raises(NoSuchStateError, match="no state 'nope'"):
        sp.read_states("user-state", ["count", "nope"])
    with pytest.raises(InvalidOptionError, match="operator state"):
        sp.read_states("operator-state", ["rules"], key="x")
    with pytest.raises(NoSuchStateError, match="no readable keyed state"):
        sp.read_states("operator-state", key="x")
    with pytest.raises(NoSuchStateError, match="no readable state"):
        sp.read_states("window-sink")
    with pytest.raises(InvalidOptionError, match="batch_size"):
        sp.read_operator("user-state", batch_size=0)
    # plan_states refuses states of two operators
    infos = [sp.state("user-state", "count"), sp.state("window-agg", "window-contents")]
    with pytest.raises(InvalidOptionError, match="one operator"):
        plan_states(sp.model, sp.context, infos)
