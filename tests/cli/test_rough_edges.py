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
