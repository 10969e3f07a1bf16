"""The layout of ``statequery/io``: the package face only re-exports (issue 36); the seam, the
confinement, each file system and range reading live in their own modules."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import statequery.io

IO_DIR = Path(statequery.io.__file__).resolve().parent


def test_the_face_only_faces() -> None:
    path = IO_DIR / "__init__.py"
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 60
    kinds = {type(node).__name__ for node in ast.parse(text).body}
    assert kinds <= {"Expr", "ImportFrom", "Assign"}, kinds  # docstring, re-exports, __all__


def test_every_public_name_is_its_module_s_own() -> None:
    homes = {
        "FileIO": "fileio", "FileSystem": "fileio", "InputFile": "fileio", "ReadStats": "fileio",
        "LocalFileSystem": "local", "FsspecFileSystem": "fsspec",
        "filesystem_of": "confine", "is_local": "confine", "is_under": "confine",
        "join_location": "confine", "location_parent": "confine",
        "normalize_location": "confine", "same_store": "confine", "store_of": "confine",
    }
    assert sorted(statequery.io.__all__) == sorted(homes)
    for name, module in homes.items():
        home = importlib.import_module(f"statequery.io.{module}")
        assert getattr(statequery.io, name) is getattr(home, name), name
