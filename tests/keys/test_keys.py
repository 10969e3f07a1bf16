"""Keys typed as text (CLI, Spark ``key`` option, SQL literals): exact conversions only, typed
errors naming the field and the type it expects."""

from __future__ import annotations

from pathlib import Path

import pytest

from statequery.cli import main
from statequery.exceptions import InvalidKeyError, InvalidOptionError
from statequery.keys import convert_key, parse_key_text
from statequery.serializers.spec import (
    NullableSpec,
    PrimitiveSpec,
    RowDataSpec,
    RowSpec,
    SqlField,
    SqlType,
    TupleSpec,
)

WORD_COUNTS = str(Path(__file__).resolve().parents[2] / "catalog" / "word_counts")
ACC = "groupaggregate_7__accstate"


STRING = SqlType("VARCHAR", length=2147483647)


def _row(*fields: tuple[str, SqlType]) -> RowDataSpec:
    return RowDataSpec(type=SqlType("ROW", fields=tuple(SqlField(n, t) for n, t in fields)))


_MIXED = _row(("id", SqlType("BIGINT")), ("small", SqlType("TINYINT")),
              ("ratio", SqlType("DOUBLE")), ("on", SqlType("BOOLEAN")), ("name", STRING))


@pytest.mark.parametrize(
    ("argv", "got"),
    [
        (["read", WORD_COUNTS, ACC, "--key", "[5]"], "the number 5"),
        (["read", WORD_COUNTS, ACC, "--key", "[true]"], "the boolean true"),
        (["read", WORD_COUNTS, ACC, "--key", '{"f0": 5}'], "the number 5"),
        (["lookup", WORD_COUNTS, '{"f0": 5}'], "the number 5"),
        (["lookup", WORD_COUNTS, "[5]", "--operator", "GroupAggregate[7]"], "the number 5"),
    ],
)
def test_wrong_field_type_is_a_one_line_error(
    argv: list[str], got: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("statequery: ") and err.count("\n") == 1, err
    assert "field f0 is STRING" in err and got in err


def test_right_field_type_still_reads(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["read", WORD_COUNTS, ACC, "--key", '["w13"]', "--json"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 1 and '"key": {"f0": "w13"}' in rows[0]


def test_lookup_says_how_the_key_was_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lookup", WORD_COUNTS, '["nobody"]']) == 1
    err = capsys.readouterr().err
    assert 'GroupAggregate[7]: read as ROW<f0 STRING> {"f0": "nobody"}' in err


def test_exact_conversions() -> None:
    spec = _MIXED

    def row(*values: object) -> dict[str, object]:
        return dict(zip(("id", "small", "ratio", "on", "name"), values, strict=True))

    assert parse_key_text('[5, 7, 2, true, "a"]', spec) == row(5, 7, 2.0, True, "a")
    assert parse_key_text('[5.0, "-7", 2.5, "false", "a"]', spec) == row(5, -7, 2.5, False, "a")
    got = parse_key_text('{"name": "a", "on": true, "ratio": 1, "small": 0, "id": "12"}', spec)
    assert got == row(12, 0, 1.0, True, "a")
    assert type(got["ratio"]) is float
    assert parse_key_text('[null, 1, 1, true, null]', spec) == row(None, 1, 1.0, True, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[5.5, 1, 1, true, "a"]', "field id is BIGINT, got the number 5.5"),
        ('[true, 1, 1, true, "a"]', "field id is BIGINT, got the boolean true"),
        ('[1, 300, 1, true, "a"]', "field small is TINYINT, got the number 300 (300 is out of"),
        ('[1, 1, true, true, "a"]', "field ratio is DOUBLE, got the boolean true"),
        ('[1, 1, 1, 1, "a"]', "field on is BOOLEAN, got the number 1"),
        ('[1, 1, 1, true, 5]', 'field name is STRING, got the number 5 (for the text write "5")'),
        ('[1, 1, 1, true]', "has 5 field(s) (id, small, ratio, on, name), got 4 value(s)"),
        ('{"id": 1, "colour": 2}', "has no field 'colour' (fields: id, small, ratio, on, name)"),
        ('{"id": 1}', "needs field 'small'"),
        ("[1, 2", "is not valid JSON"),
    ],
)
def test_inexact_conversions_raise(text: str, message: str) -> None:
    spec = _MIXED
    with pytest.raises(InvalidKeyError) as e:
        parse_key_text(text, spec)
    assert message in str(e.value)
    assert isinstance(e.value, InvalidOptionError)  # callers catching option errors still do


def test_nested_rows_tuples_and_rows() -> None:
    inner = SqlType("ROW", fields=(SqlField("x", SqlType("INTEGER")),))
    spec = _row(("a", SqlType("VARCHAR")), ("b", inner))
    assert parse_key_text('["k", {"x": 3}]', spec) == {"a": "k", "b": {"x": 3}}
    with pytest.raises(InvalidKeyError, match=r"field b\.x is INTEGER, got the string \"y\""):
        parse_key_text('["k", ["y"]]', spec)
    pair = TupleSpec(fields=(PrimitiveSpec(name="string"), PrimitiveSpec(name="int")))
    assert parse_key_text('["a", 1]', pair) == {"f0": "a", "f1": 1}
    with pytest.raises(InvalidKeyError, match="field f1 is INT, got the string"):
        parse_key_text('["a", "b"]', pair)
    row = RowSpec(fields=(NullableSpec(inner=PrimitiveSpec(name="long")),), names=("id",))
    assert parse_key_text('{"id": 9}', row) == {"id": 9}
    assert parse_key_text("9", row) == {"id": 9}
    assert convert_key({"id": 9.0}, row) == {"id": 9}


def test_scalar_keys_say_what_they_were_read_as() -> None:
    assert parse_key_text("42", PrimitiveSpec(name="long")) == 42
    assert parse_key_text("42.0", PrimitiveSpec(name="long")) == 42
    assert parse_key_text("[5]", PrimitiveSpec(name="string")) == "[5]"
    with pytest.raises(InvalidKeyError, match="'user-3' was read as the text 'user-3', which is "
                       "not a valid BIGINT"):
        parse_key_text("user-3", PrimitiveSpec(name="long"))
    with pytest.raises(InvalidKeyError, match="not a valid INT"):
        parse_key_text("3000000000", PrimitiveSpec(name="int"))
    with pytest.raises(InvalidKeyError, match="not a valid BOOLEAN"):
        parse_key_text("yes", PrimitiveSpec(name="boolean"))
    one = _row(("n", SqlType("BIGINT")))
    with pytest.raises(InvalidKeyError, match=r"not a valid BIGINT \(the type of field n\)"):
        parse_key_text("abc", one)


def test_serialized_keys_read_back_as_the_key() -> None:
    """The bytes resolve_key writes are what the readers decode back into the same key."""
    import pickle

    from statequery.keys import resolve_key
    from statequery.serializers.readers import reader_for

    string, long_ = PrimitiveSpec(name="string"), PrimitiveSpec(name="long")
    cases = [
        (string, "héllo€😀\x00"),
        (PrimitiveSpec(name="double"), -0.0),
        (PrimitiveSpec(name="char"), "é"),
        (TupleSpec(fields=(string, PrimitiveSpec(name="int"))), {"f0": "", "f1": -7}),
        (RowSpec(fields=(string, NullableSpec(inner=long_)), names=("name", "id")),
         {"name": "a", "id": None}),
        (RowSpec(fields=(string, long_), names=("name", "id")), {"name": None, "id": 5}),
    ]
    for spec, key in cases:
        got = resolve_key(key, spec, 128)
        assert got.value == key and got.serialized is not None
        value, end = reader_for(spec).read_at(got.serialized, 0, len(got.serialized))
        assert (value, end) == (key, len(got.serialized)), spec
        assert pickle.loads(pickle.dumps(got)) == got
    # 0.0 and -0.0 are two keys to Flink (different bytes, different hashCode)
    zero = resolve_key(0.0, PrimitiveSpec(name="double"), 128)
    assert zero.serialized != resolve_key(-0.0, PrimitiveSpec(name="double"), 128).serialized


def test_nanosecond_timestamps_and_their_text() -> None:
    import datetime as dt
    import pickle

    from statequery.keys import resolve_key

    spec = _row(("t", SqlType("TIMESTAMP_WITHOUT_TIME_ZONE", precision=9)))
    got = resolve_key({"t": "2024-01-01T00:00:00.123456789"}, spec, 128)
    assert got.value["t"] == dt.datetime(2024, 1, 1, 0, 0, 0, 123456)
    assert got.value["t"].nanosecond == 789
    back = pickle.loads(pickle.dumps(got))
    assert back == got and back.value["t"].nanosecond == 789
    assert resolve_key(back.value, spec, 128) == got
    micros = resolve_key({"t": dt.datetime(2024, 1, 1, 0, 0, 0, 123456)}, spec, 128)
    assert micros.serialized != got.serialized
    three = _row(("t", SqlType("TIMESTAMP_WITHOUT_TIME_ZONE", precision=3)))
    with pytest.raises(InvalidKeyError, match=r"more fractional digits than TIMESTAMP\(3\)"):
        resolve_key({"t": "2024-01-01T00:00:00.1234"}, three, 128)
    ltz = _row(("t", SqlType("TIMESTAMP_WITH_LOCAL_TIME_ZONE", precision=3)))
    utc = resolve_key({"t": "2024-01-01T01:00:00+01:00"}, ltz, 128)
    assert utc.value["t"] == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert utc == resolve_key({"t": "2024-01-01 00:00:00Z"}, ltz, 128)
