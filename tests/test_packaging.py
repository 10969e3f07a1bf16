"""Packaging: pyproject metadata in current setuptools form."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_license_is_an_spdx_string() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    # a TOML table (license = { text = ... }) is deprecated by setuptools >= 77
    assert re.search(r'^license = "Apache-2\.0"$', text, re.M)
    assert not re.search(r"^license\s*=\s*\{", text, re.M)
    assert re.search(r'"setuptools>=(7[7-9]|[89]\d)', text)
