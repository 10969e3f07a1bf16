"""What the test suite and the repository leave behind: nothing in the user's home, nothing
untracked after a spark-sql run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from statequery.backends.cache import default_cache_dir

ROOT = Path(__file__).resolve().parent.parent


def test_tests_use_their_own_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    cache = Path(default_cache_dir())
    assert cache.is_relative_to(tmp_path_factory.getbasetemp())
    assert not cache.is_relative_to(Path(os.path.expanduser("~"), ".cache"))
    # subprocesses (the CLI, Spark's Python workers) inherit it
    out = subprocess.run(
        [sys.executable, "-c",
         "from statequery.backends.cache import default_cache_dir; print(default_cache_dir())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert out == str(cache)


@pytest.mark.parametrize("name", ["derby.log", "metastore_db/x", "spark-warehouse/t/part-0"])
def test_spark_leftovers_are_ignored(name: str) -> None:
    res = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", name], cwd=ROOT, capture_output=True
    )
    assert res.returncode == 0, f"{name} is not in .gitignore"
