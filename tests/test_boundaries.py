"""Architecture rules that must hold: checked on the code, not assumed."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import statequery
from tests.conftest import fixture_dir

PACKAGE = Path(statequery.__file__).resolve().parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_storage_seam_imports_fsspec() -> None:
    users = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "fsspec" in _imports(p)
    )
    assert users and all(u.startswith("io" + os.sep) for u in users), users


def test_only_the_spark_package_imports_pyspark() -> None:
    users = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "pyspark" in _imports(p)
    )
    assert os.path.join("spark", "__init__.py") in users, users
    assert all(u.startswith("spark" + os.sep) for u in users), users


def test_reading_everything_loads_no_pyspark() -> None:
    code = (
        "import sys, statequery\n"
        f"sp = statequery.open({str(fixture_dir('sql-rocksdb-native'))!r})\n"
        "for s in sp.states:\n"
        "    sp.read(s)\n"
        "sp.lookup('w3')\n"
        "import statequery.cli, statequery.catalog\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_reading_never_writes_into_the_savepoint(tmp_path: Path) -> None:
    for name in ("datastream-rocksdb-native", "datastream-hashmap-canonical"):
        copy = tmp_path / name
        shutil.copytree(fixture_dir(name), copy)
        before = sorted((p.relative_to(copy), p.stat().st_size, p.stat().st_mtime_ns)
                        for p in copy.rglob("*"))
        sp = statequery.open(str(copy))
        for state in sp.states:
            sp.read(state)
        sp.lookup("user-3")
        after = sorted((p.relative_to(copy), p.stat().st_size, p.stat().st_mtime_ns)
                       for p in copy.rglob("*"))
        assert after == before, name
