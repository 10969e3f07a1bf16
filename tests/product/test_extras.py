"""The extras `all` and `test` hold every package of the extras they stand for, and name no
``statequery[...]`` (pip 23.x, what ``python3 -m venv`` brings, could not resolve ``.[test]`` with
the self-reference: docs in pyproject.toml)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

EXTRAS = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())[
    "project"]["optional-dependencies"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.mark.parametrize("name", ["all", "test"])
def test_extra_lists_its_packages_without_self_reference(name: str) -> None:
    packages = _names(EXTRAS[name])
    assert "statequery" not in packages
    for part in ("spark", "rocksdb", "sql", "s3"):
        assert _names(EXTRAS[part]) <= packages, (name, part)
