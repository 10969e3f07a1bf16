"""Every CLI command over a list of bad inputs (issue 23): each ends in exit status 1 (or 0 when
the input is fine after all) with one line ``statequery: <message>`` on stderr, a typed error,
never a traceback and never the catch-all "unexpected error"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from statequery.cli import main
from tests.conftest import fixture_dir

CANONICAL = "datastream-hashmap-canonical"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def bad(tmp_path: Path) -> dict[str, str]:
    """Bad savepoint locations, each a different way of being wrong."""
    good = fixture_dir(CANONICAL)
    empty = tmp_path / "empty-dir"
    empty.mkdir()
    garbage = tmp_path / "garbage" / "_metadata"
    garbage.parent.mkdir()
    garbage.write_bytes(os.urandom(3000))
    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    meta = (truncated / "_metadata").read_bytes()
    (truncated / "_metadata").write_bytes(meta[: len(meta) // 2])
    missing_state = tmp_path / "missing-state"
    shutil.copytree(good, missing_state)
    for f in missing_state.iterdir():
        if f.name != "_metadata":
            f.unlink()
    cut_state = tmp_path / "cut-state"
    shutil.copytree(good, cut_state)
    for f in cut_state.iterdir():
        if f.name != "_metadata":
            f.write_bytes(f.read_bytes()[:37])
    fifo = tmp_path / "fifo-sp"
    shutil.copytree(good, fifo)
    victim = next(f for f in fifo.iterdir() if f.name != "_metadata")
    victim.unlink()
    os.mkfifo(victim)
    a_file = tmp_path / "plain.txt"
    a_file.write_text("hello\n")
    return {
        "nonexistent": str(tmp_path / "no-such-savepoint"),
        "empty string": "",
        "empty dir": str(empty),
        "a plain file": str(a_file),
        "garbage _metadata": str(garbage.parent),
        "truncated _metadata": str(truncated),
        "state files missing": str(missing_state),
        "state files cut": str(cut_state),
        "a FIFO as state file": str(fifo),
        "a device": "/dev/zero",
        "unknown scheme": "nosuchscheme://bucket/sp",
        "hdfs without a JVM": "hdfs://127.0.0.1:1/x",
        "http, nothing listening": "http://127.0.0.1:1/sp/_metadata",
        "s3 without a bucket": "s3:///x",
        "NUL byte": "/tmp/a\x00b",
        "file URI of a directory": "file:///",
    }


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def _assert_one_line(argv: list[str], code: int, err: str) -> None:
    assert "Traceback" not in err, (argv, err)
    assert code in (0, 1), (argv, code, err)
    if code == 1:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("statequery: "), (argv, err)
        assert "unexpected error" not in err, (argv, err)


def _commands(path: str, out: Path) -> list[list[str]]:
    return [
        ["inspect", path],
        ["inspect", path, "--json"],
        ["inspect", path, "--no-snapshot"],
        ["snapshot", path, "--out", str(out / "snap.msgpack")],
        ["read", path, "user_state__count"],
        ["read", path, "--operator", "user-state", "--state", "count", "--json"],
        ["lookup", path, "user-3"],
        ["stats", path, "--json"],
        ["splits", path, "fixture-source"],
        ["export", path, "user-state", "--out", str(out / "export")],
        ["diff", path, str(fixture_dir(CANONICAL))],
        ["diff", str(fixture_dir(CANONICAL)), path],
        ["attach", path, "--print"],
    ]


def test_every_command_over_bad_savepoints(
    bad: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STATEQUERY_RETRIES", "1")
    monkeypatch.setenv("STATEQUERY_CACHE_DIR", str(tmp_path / "cache"))
    failures = 0
    for name, path in bad.items():
        out = tmp_path / "out" / name.replace(" ", "-")
        out.mkdir(parents=True)
        for argv in _commands(path, out):
            code, err = _run(argv, capsys)
            _assert_one_line(argv, code, err)
            failures += code == 1
    assert failures > len(bad) * 10


def test_bad_arguments_on_a_good_savepoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sp = str(fixture_dir(CANONICAL))
    cases = [
        ["read", sp, "no_such_table"],
        ["read", sp],
        ["read", sp, "user_state__count", "--key", "{not json"],
        ["read", sp, "user_state__count", "--key", "[1, 2, 3]"],
        ["read", sp, "user_state__count", "--key", "\x00"],
        ["read", sp, "user_state__count", "--limit", "-1"],
        ["read", sp, "user_state__count", "--out", str(tmp_path / "nodir" / "x.parquet")],
        ["read", sp, "user_state__count", "--out", str(tmp_path / "x.txt")],
        ["read", sp, "user_state__count", "--out", str(tmp_path)],
        ["read", sp, "--operator", "nope", "--state", "count"],
        ["read", sp, "--operator", "user-state", "--state", "nope"],
        ["read", sp, "user_state__count", "--storage-option", "novalue"],
        ["lookup", sp, "{\"a\": 1}"],
        ["lookup", sp, "user-3", "--operator", "nope"],
        ["stats", sp, "--parallelism", "0"],
        ["stats", sp, "--parallelism", "-3"],
        ["stats", sp, "--top", "-1"],
        ["stats", sp, "--operator", "nope"],
        ["splits", sp, "nope"],
        ["splits", sp, "user-state"],
        ["splits", sp, "fixture-source", "--source", "kafka"],
        ["export", sp, "nope", "--out", str(tmp_path / "e1")],
        ["export", sp, "user-state", "--out", str(tmp_path / "nodir" / "e2")],
        ["export", sp, "user-state", "--state", "nope", "--out", str(tmp_path / "e3")],
        ["diff", sp, sp, "--key", "{bad"],
        ["diff", sp, sp, "--operator", "nope"],
        ["spark-views", "--catalog", str(tmp_path / "no-catalog")],
        ["spark-views", "no_such_database"],
        ["shell", "--catalog", str(tmp_path / "no-catalog"), "--print-command"],
        ["attach", str(tmp_path / "no-catalog"), "--print"],
        ["snapshot", sp, "--plan", str(tmp_path / "no-plan.json"), "--out",
         str(tmp_path / "s.msgpack")],
        ["snapshot", sp, "--plan", "/etc/hostname", "--out", str(tmp_path / "s.msgpack")],
        ["snapshot", sp, "--out", str(tmp_path / "nodir" / "s.msgpack")],
    ]
    fine = []
    for argv in cases:
        code, err = _run(argv, capsys)
        _assert_one_line(argv, code, err)
        if code == 0:
            fine.append(argv[:1] + argv[2:])
    assert len(fine) < len(cases) // 3, fine  # some are valid after all (string keys)


SQL_CASES = [
    "",
    "SELEC key",
    "SELECT 1/0 AS x FROM user_activity.user_state__count",
    "SELECT 1e999999 AS x FROM user_activity.user_state__count",
    "SELECT key FROM nosuch.tbl",
    "SELECT key FROM user_activity.nosuch",
    "SELECT key FROM user_activity.user_state__count WHERE key = 123456789012345678901234567890",
    "SELECT CAST('x' AS INT) AS x FROM user_activity.user_state__count",
    "SELECT to_date(key) AS d FROM user_activity.user_state__count",
    "SELECT list_sum(range(250000000)) AS n FROM user_activity.user_state__count",
    "SELECT * FROM user_activity.user_state__count, LATERAL read_text('/etc/passwd')",
    "SELECT key FROM user_activity.user_state__count" + " UNION ALL SELECT key FROM "
    "user_activity.user_state__count" * 0 + ")" * 400,
    "SELECT " + "(" * 5000 + "1" + ")" * 5000 + " AS x FROM user_activity.user_state__count",
]


@pytest.mark.parametrize("query", SQL_CASES)
def test_sql_bad_queries(query: str, capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ([], ["--json"]):
        code, err = _run(["sql", query, *extra], capsys)
        _assert_one_line(["sql", query], code, err)  # some are plain SELECTs after all


def test_sql_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = "SELECT key FROM user_activity.user_state__count"
    plain = tmp_path / "plain"
    plain.write_text("x")
    for extra in (["--catalog", str(tmp_path / "none")], ["--catalog", str(plain)],
                  ["--timeout", "-1"], ["--timeout", "nan"], ["--memory-limit", "lots"],
                  ["--memory-limit", "1KiB"], ["--threads", "0"], ["--max-rows", "0"],
                  ["--max-rows", "3"], ["--max-bytes", "1B"]):
        code, err = _run(["sql", q, *extra], capsys)
        _assert_one_line(extra, code, err)
        assert code == 1, (extra, err)


ISSUE_CASES = [
    # a date past year 9999 (an OverflowError traceback before, with or without --json)
    (["sql", "SELECT CAST('100000-01-01' AS DATE) AS d FROM user_activity.user_state__count "
      "LIMIT 1"], 0, None),
    (["sql", "SELECT CAST('100000-01-01' AS DATE) AS d FROM user_activity.user_state__count "
      "LIMIT 1", "--json"], 0, None),
    # hdfs without a JVM names what is missing
    (["inspect", "hdfs://127.0.0.1:1/x"], 1, "JAVA_HOME"),
]


@pytest.mark.parametrize(("argv", "status", "says"), ISSUE_CASES)
def test_issue_cases_in_a_real_process(argv: list[str], status: int, says: str | None) -> None:
    """Through a real process: what a user sees on the terminal (native libraries' output
    included)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STATEQUERY_RETRIES": "1"}
    env.pop("JAVA_HOME", None)
    proc = subprocess.run([sys.executable, "-m", "statequery.cli", *argv], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == status, proc.stderr
    if status:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("statequery: "), proc.stderr
        assert says in lines[0]
    else:
        assert "35804722" in proc.stdout  # the date as days since the epoch
