"""What a new user hits first (issue 8): one-line errors instead of tracebacks, --version,
relative paths, CSV output of nested columns, a closed pipe, inspect at 80 columns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import statequery
from statequery.cli import main

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "catalog"
USER_ACTIVITY = CATALOG / "user_activity"
WORD_COUNTS = CATALOG / "word_counts"
SAVEPOINT = next(USER_ACTIVITY.iterdir())


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statequery.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"statequery {statequery.__version__}"


def test_table_typo_lists_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["read", str(USER_ACTIVITY), "user_state__cont"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("statequery: no state table 'user_state__cont'")
    assert "did you mean 'user_state__count'?" in err
    assert "user_state__profile" in err and "operator_state__rules" in err


def test_out_into_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nonexistent" / "dir" / "x.parquet"
    assert main(["read", str(USER_ACTIVITY), "user_state__count", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == f"statequery: --out {out}: the directory {out.parent} does not exist\n"
    assert not out.parent.exists()
    # an existing directory as the output file: refused, nothing written
    assert main(["read", str(USER_ACTIVITY), "user_state__count", "--out", str(tmp_path)]) == 1
    assert main(["read", str(USER_ACTIVITY), "user_state__count", "--out",
                 str(tmp_path / "x.txt")]) == 1
    assert list(tmp_path.iterdir()) == []


def test_csv_flattens_structs_and_encodes_the_rest(tmp_path: Path) -> None:
    import base64
    import json

    import pyarrow.csv as pacsv

    sp = statequery.open(str(USER_ACTIVITY))

    def csv_of(table: str, *extra: str) -> list[dict[str, object]]:
        out = tmp_path / f"{table}.csv"
        assert main(["read", str(USER_ACTIVITY), table, "--out", str(out), *extra]) == 0
        rows = pacsv.read_csv(out).to_pylist()
        assert rows, out
        return sorted(rows, key=lambda r: (r.get("key") or "", r.get("index") or 0))

    # struct in struct: value.address.city
    profile = {r["key"]: r["value"] for r in sp.read("user_state__profile").to_pylist()}
    rows = csv_of("user_state__profile")
    assert {r["key"]: (r["value.address.city"], r["value.address.zip"], r["value.tier"])
            for r in rows} == {
        k: (v["address"]["city"], v["address"]["zip"], v["tier"]) for k, v in profile.items()
    }
    # list: JSON text
    lists = {r["key"]: r["value"] for r in sp.read("user_state__recent_categories").to_pylist()}
    assert {r["key"]: json.loads(r["value"]) for r in csv_of("user_state__recent_categories")} \
        == lists
    # map (nested mode): JSON array of [key, value] pairs
    maps = {r["key"]: dict(r["map"])
            for r in sp.read("user_state__amount_by_category", mode="nested").to_pylist()}
    got = {r["key"]: dict(json.loads(r["map"]))
           for r in csv_of("user_state__amount_by_category", "--mode", "nested")}
    assert got == maps and len(got) == 20
    # binary: base64
    raw = [r["value"] for r in sp.read("fixture_source__sourcereaderstate").to_pylist()]
    got_raw = [base64.b64decode(r["value"]) for r in csv_of("fixture_source__sourcereaderstate")]
    assert sorted(got_raw) == sorted(raw) and all(isinstance(b, bytes) for b in raw)
    # nothing but the outputs in the directory (no temporary files left behind)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{t}.csv" for t in ("user_state__profile", "user_state__recent_categories",
                             "user_state__amount_by_category",
                             "fixture_source__sourcereaderstate")
    )


@pytest.mark.parametrize(("args", "first_line"), [
    (("inspect", str(USER_ACTIVITY), "--json"), b"{\n"),
    # a rich table (rich's own broken-pipe handling exits 1)
    (("inspect", str(USER_ACTIVITY)), str(SAVEPOINT).encode()),
])
def test_closed_pipe_is_a_quiet_exit(args: tuple[str, ...], first_line: bytes) -> None:
    import fcntl

    # a one-page pipe into `head -1`: the CLI's output (about 18 kB) cannot all fit before head
    # exits, so the CLI writes into a closed pipe every time
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    head = subprocess.Popen(["head", "-1"], stdin=read_end, stdout=subprocess.PIPE)
    os.close(read_end)
    cli = subprocess.Popen(
        [sys.executable, "-m", "statequery.cli", *args],
        stdout=write_end, stderr=subprocess.PIPE,
    )
    os.close(write_end)
    first, _ = head.communicate(timeout=120)
    _, err = cli.communicate(timeout=120)
    assert first.startswith(first_line)
    assert err == b"" and cli.returncode == 0


def test_read_json_into_head() -> None:
    res = subprocess.run(
        f"{sys.executable} -m statequery.cli read {USER_ACTIVITY} user_state__recent_categories "
        "--mode flat --json | head -1",
        shell=True, capture_output=True, text=True, timeout=120,
    )
    assert res.stderr == "" and res.stdout.startswith('{"key_group": ')



@pytest.mark.parametrize(
    ("cwd", "path"),
    [(SAVEPOINT, "."), (SAVEPOINT, "_metadata"), (SAVEPOINT, "./"), (USER_ACTIVITY, "."),
     (CATALOG, "user_activity"), (CATALOG / "word_counts", "../user_activity")],
)
def test_relative_paths(cwd: Path, path: str) -> None:
    res = _cli("read", path, "user_state__count", "--key", "user-3", "--json", cwd=cwd)
    assert res.returncode == 0, res.stderr
    assert res.stdout == '{"key_group": 40, "key": "user-3", "namespace": null, "value": 10}\n'
    res = _cli("inspect", path, "--json", cwd=cwd)
    assert res.returncode == 0, res.stderr
    assert f'"location": "{SAVEPOINT}"' in res.stdout


def test_relative_catalog_paths() -> None:
    res = _cli("inspect", ".", cwd=CATALOG)
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert "holds several savepoints or checkpoints; name one of:" in res.stderr
    assert str(SAVEPOINT) in res.stderr
    res = _cli("sql", "SELECT count(*) AS n FROM user_activity.user_state__count",
               "--catalog", ".", "--json", cwd=CATALOG)
    assert (res.returncode, res.stdout) == (0, '{"n": 20}\n'), res.stderr
    res = _cli("spark-views", "--catalog", ".", "user_activity", cwd=CATALOG)
    assert res.returncode == 0 and f"'path'='{SAVEPOINT}'" in res.stdout  # quoted by sqlglot


def _inspect_in_a_terminal(columns: int) -> list[str]:
    """``statequery inspect`` run in a pseudo-terminal ``columns`` wide; its lines, ANSI-free."""
    import fcntl
    import pty
    import re
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "statequery.cli", "inspect", str(WORD_COUNTS)],
        stdout=follower, stderr=subprocess.PIPE, env=env,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the terminal closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", b"".join(chunks).decode("utf-8"))
    return text.replace("\r", "").splitlines()


def test_inspect_at_80_columns_keeps_names_whole() -> None:
    lines = _inspect_in_a_terminal(80)
    assert max(len(line) for line in lines) <= 80
    words = {w for line in lines for w in line.split()}
    sp = statequery.open(str(WORD_COUNTS))
    for name in sp.state_meta().column("table_name").to_pylist():
        assert name in words, name
    for op in sp.operators:
        assert op.operator_id in words


def test_inspect_honours_columns_in_a_pipe() -> None:
    res = _cli("inspect", str(WORD_COUNTS), env={"COLUMNS": "80"})
    assert res.returncode == 0
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    assert "  groupaggregate_7__timer_state_processing_user_timers" in res.stdout
