"""The documentation's examples run as written.

* Every ``statequery ...`` command in a fenced shell block of README.md, catalog/README.md and
  docs/*.md, and every inline ``statequery sql|lookup|read|inspect|stats ...``, that names no
  placeholder (``PATH``, ``[--json]``, ``...``) and needs no Spark, server or running Flink: it
  exits 0, or, where the doc shows the ``statequery: ...`` line it prints, exits 1 with exactly
  that line. So does the example query of ``statequery sql --help``.
* Every ``python`` block that starts with ``import statequery`` and opens only the shipped
  catalog or the test fixtures (``statequery.open("catalog/...")``, ``("tests/...")``) runs.
* Every SQL query of docs/decoding.md, over a catalog built as the doc's ``-- database NAME: the
  fixture FIXTURE [with its plan]`` comments say: it runs and returns rows.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

import statequery
from statequery.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
DOCS = [ROOT / "README.md", ROOT / "catalog" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: commands that start Spark, a server or talk to a Flink cluster (tested elsewhere)
NOT_HERE = {"attach", "detach", "shell", "serve", "capture"}
#: placeholders the docs use for a path of their own: the fixture that matches the example
PLACEHOLDERS = {"SP": str(FIXTURES / "keys-sql-hashmap-canonical")}
_FENCE = re.compile(r"^ *```([a-z]*)\n(.*?)^ *```", re.S | re.M)
_INLINE = re.compile(r"`(statequery\s(?:sql|lookup|read|inspect|stats)\s[^`-][^`]*)`")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def _runnable(command: str) -> bool:
    bare = _QUOTED.sub("", command.split(" #")[0])
    words = bare.split()
    if len(words) < 2 or words[1] in NOT_HERE or "--spark" in words:
        return False
    if words[1] == "snapshot" and "--out" not in words:
        return False  # it would write into the savepoint
    placeholder = [w for w in words[2:] if w not in PLACEHOLDERS
                   and re.fullmatch(r"[A-Z][A-Z_]*(\.json)?|\.\.\.", w)]
    return not (placeholder or re.search(r"(^|\s)\[|\||\$\(|://|^/savepoints|\s/savepoints|"
                                         r"\s/data/", bare))


def _examples() -> list[tuple[str, str, str | None]]:
    """(where, command, the error line the doc shows for it or None)."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        name = doc.relative_to(ROOT).as_posix()
        for m in _FENCE.finditer(text):
            lang, body = m.groups()
            if lang not in ("", "sh", "bash", "console", "shell"):
                continue
            lines = body.splitlines()
            for i, line in enumerate(lines):
                command = line.strip().removeprefix("$ ")
                if not command.startswith("statequery ") or not _runnable(command):
                    continue
                after = lines[i + 1].strip() if i + 1 < len(lines) else ""
                error = after if after.startswith("statequery: ") else None
                found.append((f"{name}:{text[:m.start()].count(chr(10)) + i + 2}", command, error))
        for m in _INLINE.finditer(text):
            command = " ".join(m.group(1).split())
            # paths relative to a savepoint or catalog folder are checked in tests/cli
            if _runnable(command) and not re.search(r"\s(\.|_metadata)(\s|$)", command):
                found.append((f"{name}:{text[:m.start()].count(chr(10)) + 1}", command, None))
    return found


EXAMPLES = _examples()


def test_the_documented_commands_are_found() -> None:
    commands = {c for _, c, _ in EXAMPLES}
    assert len(EXAMPLES) >= 10
    assert any(c.startswith("statequery export") for c in commands)
    assert any(c.startswith("statequery sql") for c in commands)
    assert sum(e is not None for _, _, e in EXAMPLES) >= 3


@pytest.mark.parametrize(("where", "command", "error"), EXAMPLES,
                         ids=[w for w, _, _ in EXAMPLES])
def test_documented_command_runs(where: str, command: str, error: str | None, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(command, comments=True)[1:]
    if ">" in argv:  # a shell redirection: the output goes to stdout here
        argv = argv[:argv.index(">")]
    # outputs under /tmp go to this test's own directory
    argv = [str(tmp_path / a[len("/tmp/"):]) if a.startswith("/tmp/") else PLACEHOLDERS.get(a, a)
            for a in argv]
    monkeypatch.chdir(ROOT)
    try:
        status = main(argv)
    except SystemExit as e:  # --version, --help: argparse exits
        status = e.code
    out, err = capsys.readouterr()
    if error is None:
        assert status == 0, f"{where}: {command}\n{err}"
        assert out.strip(), f"{where}: {command} printed nothing"
    else:
        # 2: a command line argparse rejects (its one line points to --help)
        want = 2 if error.endswith(" --help')") else 1
        assert (status, err.splitlines()) == (want, [error]), f"{where}: {command}"


def test_help_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    from statequery.cli.parser import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    helps = [a.help or "" for a in sub.choices["sql"]._actions]  # type: ignore[attr-defined]
    [query] = [m.group(1) for h in helps for m in re.finditer(r'e\.g\. "([^"]+)"', h)]
    assert main(["sql", query, "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 20  # user-0 .. user-19
    # statequery --help: "Try it on the example catalog: statequery ...; statequery ..."
    tries = (parser.epilog or "").split(": ", 1)[1].split(". ")[0].split("; ")
    assert len(tries) == 3
    for command in tries:
        assert main(shlex.split(command)[1:]) == 0, command
        assert "user-3" in capsys.readouterr().out or "inspect" in command


def _python_blocks() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            code = m.group(1)
            opened = re.findall(r"statequery\.open\(\"([^\"]*)\"", code)
            if (code.startswith("import statequery") and opened
                    and all(p.startswith(("catalog/", "tests/")) for p in opened)):
                line = text[:m.start()].count("\n") + 2
                found.append((f"{doc.relative_to(ROOT).as_posix()}:{line}", code))
    return found


PYTHON_BLOCKS = _python_blocks()


@pytest.mark.parametrize(("where", "code"), PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_documented_python_runs(where: str, code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    exec(compile(code, where, "exec"), {})  # noqa: S102 - our own documentation


def test_python_blocks_are_found() -> None:
    assert any(w.startswith("docs/decoding.md") for w, _ in PYTHON_BLOCKS)


# -- docs/decoding.md's SQL ------------------------------------------------------------------

_DATABASE = re.compile(r"-- database (\w+): the fixture ([\w.-]+)( with its plan)?")


def _decoding_queries() -> tuple[list[str], dict[str, tuple[str, bool]]]:
    text = (ROOT / "docs" / "decoding.md").read_text(encoding="utf-8")
    databases = {m.group(1): (m.group(2), bool(m.group(3))) for m in _DATABASE.finditer(text)}
    queries = []
    for body in re.findall(r"^```sql\n(.*?)^```", text, re.S | re.M):
        current: list[str] = []
        for line in [*body.splitlines(), "--"]:
            if line.startswith("--"):
                if current:
                    queries.append("\n".join(current))
                current = []
            else:
                current.append(line)
    return queries, databases


def _plan_of(fixture: str) -> Path:
    """The compiled plan of a fixture's job: the longest plans/<job>.json its name starts with."""
    plans = sorted((p for p in (FIXTURES / "plans").glob("*.json")
                    if fixture.startswith(p.stem + "-")), key=lambda p: len(p.stem))
    assert plans, f"no plan for {fixture}"
    return plans[-1]


def test_decoding_queries_run(tmp_path: Path) -> None:
    queries, databases = _decoding_queries()
    assert len(queries) >= 10
    for db, (fixture, with_plan) in databases.items():
        shutil.copytree(FIXTURES / fixture, tmp_path / db)
        if with_plan:
            assert main(["snapshot", str(tmp_path / db), "--plan", str(_plan_of(fixture))]) == 0
    catalog = statequery.catalog.Catalog(str(tmp_path))
    results = {}
    for query in queries:
        used = set(re.findall(r"\b(\w+)\.[\"`]", query))
        assert used and used <= databases.keys(), (
            f"docs/decoding.md: say which fixture database(s) {used - databases.keys()} are "
            f"(-- database NAME: the fixture FIXTURE [with its plan]):\n{query}")
        table = statequery.sql(query, catalog)
        assert table.num_rows > 0, query
        results[query] = table.to_pylist()
    # one of them against Flink's own restore of the fixture: the rows each Top-N keeps
    [top] = [r for q, r in results.items() if "49_rank__data_state_with_append" in q]
    fixture = databases["orders"][0]
    dump = [json.loads(line) for line in
            (FIXTURES / "dump" / f"{fixture}.jsonl").read_text().splitlines()]
    want = sorted(((e["key"]["f0"], e["user_key"]["f0"], r["f0"]) for e in dump
                   if e["operator_uid"] == "49_rank" for r in e["value"]),
                  key=lambda t: (t[0], -t[1]))
    assert [(r["category"], r["amount"], r["id"]) for r in top] == want
