"""Packaging: pyproject metadata in current setuptools form."""

from __future__ import annotations

import json
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_license_is_an_spdx_string() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    # a TOML table (license = { text = ... }) is deprecated by setuptools >= 77
    assert re.search(r'^license = "Apache-2\.0"$', text, re.M)
    assert not re.search(r"^license\s*=\s*\{", text, re.M)
    assert re.search(r'"setuptools>=(7[7-9]|[89]\d)', text)


@pytest.mark.slow
def test_plain_editable_install_lets_spark_find_the_source(tmp_path: Path) -> None:
    """`pip install -e .` with no config settings: Spark's lookup (pkgutil.iter_modules over
    sys.path) sees pyspark_statequery from the project root, and it imports; setuptools warns
    about nothing."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    py = venv / "bin" / "python"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-v", "--no-deps",
         "-e", str(ROOT)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Warning" not in re.sub(r"WARNING: Location .*", "", res.stdout + res.stderr)
    # the dependencies come from this environment, appended after the new venv's own entries
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()
    (Path(purelib) / "zz_test_dependencies.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n", encoding="utf-8"
    )
    probe = (
        "import json, pkgutil\n"
        "found = [m.module_finder.path for m in pkgutil.iter_modules()"
        " if m.name == 'pyspark_statequery']\n"
        "import pyspark_statequery\n"
        "print(json.dumps({'found': found, 'file': pyspark_statequery.__file__,"
        " 'name': pyspark_statequery.DefaultSource.name()}))\n"
    )
    out = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["found"][:1] == [str(ROOT)]
    assert doc["file"] == str(ROOT / "pyspark_statequery.py")
    assert doc["name"] == "statequery"


def test_pandas_stays_below_3_as_pyspark_asks() -> None:
    """PySpark 4.x declares pandas>=2.2 but warns on pandas 3 ("does not yet fully support
    pandas >= 3.0.0 ... use pandas < 3.0.0"): the extras that bring PySpark hold pandas below 3,
    and the environment the install resolved draws no such warning."""
    import warnings

    import tomllib
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]
    with_pyspark = sorted(k for k, v in extras.items() if any(d.startswith("pyspark") for d in v))
    assert with_pyspark == ["all", "spark", "test"]
    for name in with_pyspark:
        assert "pandas>=2.2,<3" in extras[name], name
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        require_minimum_pandas_version()
