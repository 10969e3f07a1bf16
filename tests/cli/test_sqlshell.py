"""The statement splitter and spark-sql's value format of ``statequery shell`` on a server
(statequery/cli/sqlshell.py); the shell itself runs against a real server in
tests/spark/test_server.py."""

from __future__ import annotations

import datetime
import decimal
import zoneinfo

import pyarrow as pa
import pytest

from statequery.cli.sqlshell import hive_string, result_lines, split_statements


def test_statements_end_at_a_semicolon_outside_quotes_and_comments() -> None:
    text = (
        "SELECT 'a;b', \"c\\\";\", `d;e` FROM t; -- a comment; with a semicolon\n"
        "SELECT 'it\\'s;' /* ; */ ;\n"
        "/* nothing but a comment */ ;\n"
        "-- only a comment;\n"
        "SELECT 1,\n  2"
    )
    statements, rest = split_statements(text)
    assert statements == [
        "SELECT 'a;b', \"c\\\";\", `d;e` FROM t",
        "-- a comment; with a semicolon\nSELECT 'it\\'s;' /* ; */",
    ]
    assert rest == "\n-- only a comment;\nSELECT 1,\n  2"  # its ; is in the comment
    assert split_statements("SELECT 1; SELECT 2;") == (["SELECT 1", "SELECT 2"], "")
    assert split_statements("SELECT '; unterminated") == ([], "SELECT '; unterminated")


@pytest.mark.parametrize(("value", "arrow_type", "expected"), [
    (None, pa.int32(), "NULL"),
    (1e10, pa.float64(), "1.0E10"),
    (-2.5e-7, pa.float64(), "-2.5E-7"),
    (1234567.0, pa.float64(), "1234567.0"),
    (12345678.0, pa.float64(), "1.2345678E7"),
    (0.001, pa.float64(), "0.001"),
    (float("inf"), pa.float64(), "Infinity"),
    (0.1, pa.float32(), "0.1"),  # the float's shortest digits, not the double's 0.10000000149
    (decimal.Decimal("1E+3"), pa.decimal128(5, 0), "1000"),
    (b"\xff", pa.binary(), "\ufffd"),
    (datetime.datetime(2024, 1, 2, 3, 4, 5, 120000, tzinfo=zoneinfo.ZoneInfo("Etc/UTC")),
     pa.timestamp("us", "Etc/UTC"), "2024-01-02 03:04:05.12"),
    ([("b", None), ("a", "x")], pa.map_(pa.string(), pa.string()), '{"a":"x","b":null}'),
    ({"x": [1, None]}, pa.struct([("x", pa.list_(pa.int64()))]), '{"x":[1,null]}'),
])
def test_values_as_spark_sql_prints_them(value: object, arrow_type: pa.DataType,
                                         expected: str) -> None:
    assert hive_string(value, arrow_type) == expected


def test_show_tables_prints_the_names_and_repeated_column_names_keep_their_values() -> None:
    tables = pa.table({"namespace": ["db", "db"], "tableName": ["a", "b"],
                       "isTemporary": [False, False]})
    assert result_lines("show tables in db", tables) == ["a", "b"]
    assert result_lines("SHOW TABLE EXTENDED IN db LIKE 'a'", tables) == [
        "db\ta\tfalse", "db\tb\tfalse"
    ]
    twice = pa.table([pa.array([1]), pa.array([2])], names=["a", "a"])
    assert result_lines("SELECT 1 AS a, 2 AS a", twice) == ["1\t2"]
    assert result_lines("USE db", pa.table({})) == []
