"""Packaging as users install it: a built wheel (not editable) installed into a fresh virtual
environment finds the shipped catalog; the core imports no optional dependency; a missing extra
is a clear error naming it; the package has no import cycles."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "statequery"
OPTIONAL = ("pyspark", "rocksdict", "sqlglot", "duckdb", "google_crc32c", "crc32c", "xxhash")


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_import_statequery_loads_no_optional_dependency() -> None:
    code = (
        "import sys, statequery, statequery.savepoint, statequery.catalog, statequery.cli\n"
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# (blocked module, code that needs it, the extra the error must name)
MISSING = [
    (
        "rocksdict",
        "statequery.open('catalog/user_activity_rocksdb').lookup('user-3')",
        "statequery[rocksdb]",
    ),
    (
        "xxhash",
        "statequery.open('catalog/user_activity_rocksdb').lookup('user-3')",
        "statequery[rocksdb]",
    ),
    ("sqlglot", "statequery.sql('SELECT * FROM user_activity.state_meta')", "statequery[sql]"),
    ("duckdb", "statequery.sql('SELECT * FROM user_activity.state_meta')", "statequery[sql]"),
    ("pyspark", "import pyspark_statequery", "statequery[spark]"),
]


@pytest.mark.parametrize(("module", "code", "extra"), MISSING)
def test_missing_extra_is_a_clear_error(module: str, code: str, extra: str, tmp_path: Path) -> None:
    script = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "import statequery\n"
        "try:\n"
        f"    {code}\n"
        "except statequery.MissingExtraError as e:\n"
        "    print('MISSING', e)\n"
    )
    done = _python(script, {"STATEQUERY_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MISSING"), done.stdout + done.stderr
    assert module in done.stdout and extra in done.stdout


def test_canonical_state_reads_without_any_extra() -> None:
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in OPTIONAL)
    code = (
        f"import sys; {blocked}\n"
        "import statequery\n"
        "t = statequery.open('catalog/user_activity').read('user-state', 'count', key='user-3')\n"
        "print(t.column('value').to_pylist())"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[10]"


def _module_imports(path: Path) -> set[str]:
    """``statequery`` modules imported at module level (not under TYPE_CHECKING, not in
    functions): the imports that run when the module is imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                out.add(sub.module)
            elif isinstance(sub, ast.Import):
                out.update(a.name for a in sub.names)
    return {m for m in out if m.startswith("statequery")}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        graph[_module_name(path)] = _module_imports(path)
    modules = set(graph)

    def deps(m: str) -> set[str]:
        # importing a.b.c imports a and a.b first
        out = set()
        for d in graph.get(m, ()):
            parts = d.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        return (out & modules) - {m}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(deps(m)):
            if d == "statequery" or m.startswith(d + "."):
                continue  # a package's own __init__ runs before its submodules anyway
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m)
    # savepoint discovery lives in statequery.discovery: savepoint.py does not need the catalog
    assert "statequery.catalog" not in (PACKAGE / "savepoint.py").read_text(encoding="utf-8")


@pytest.mark.slow
def test_wheel_installs_and_looks_up_in_the_shipped_catalog(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("statequery-*.whl")
    import zipfile

    shipped = set(zipfile.ZipFile(wheel).namelist())
    # the Java sources of the Spark jar, which statequery.spark.jvm compiles on first use when
    # the wheel has no jar (built without javac or Spark's jars at hand)
    assert "statequery/spark/java/statequery/DefaultSource.java" in shipped
    # and those of serve's Thrift password check and UI login (statequery.spark.jvm, SERVE_SOURCES)
    assert "statequery/spark/java_serve/statequery/serve/TokenAuthenticator.java" in shipped
    assert "statequery/spark/java_serve/statequery/serve/TokenFilter.java" in shipped
    # with them (javac here, pyspark in this build environment), the jar is in the wheel
    has_jar = shutil.which("javac") is not None
    assert ("statequery/spark/statequery-spark.jar" in shipped) == has_jar
    assert ("statequery/spark/statequery-spark.json" in shipped) == has_jar
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / "python"
    # the dependencies come from this environment's site-packages (offline and fast); its .pth
    # files (the editable install of this checkout) are not processed for a plain path entry
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_path("purelib") + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("STATEQUERY_CATALOG", "PYTHONPATH")}
    # --ignore-installed: the dependencies' site-packages also hold this checkout's editable
    # install, which must not count as the wheel being installed
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
         "--ignore-installed", str(wheel)] if _pip_has_python_option() else
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--ignore-installed",
         "--prefix", str(venv), str(wheel)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )
    assert installed.returncode == 0, installed.stderr
    where = subprocess.run(
        [str(py), "-c", "import statequery, statequery.discovery as d; "
         "print(statequery.__file__); print(d.default_catalog())"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    assert where.returncode == 0, where.stderr
    module_file, catalog = where.stdout.split()
    assert module_file.startswith(str(venv)) and catalog.startswith(str(venv)), where.stdout
    looked_up = subprocess.run(
        [str(bindir / "statequery"), "lookup", "user_activity", "user-3", "--json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    assert looked_up.returncode == 0, looked_up.stderr
    import json

    rows = [json.loads(line) for line in looked_up.stdout.splitlines()]
    counts = [r["value"] for r in rows if r["operator"] == "user-state" and r["state"] == "count"]
    assert counts == [10]
    if has_jar:  # the installed package uses its own jar: nothing to compile, no javac needed
        jar = subprocess.run(
            [str(py), "-c", "from statequery.spark.jvm import jar_path; "
             "print(jar_path(build=False))"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env=dict(env, STATEQUERY_CACHE=str(tmp_path / "empty-cache")),
        )
        assert jar.returncode == 0, jar.stderr
        assert jar.stdout.strip().startswith(str(venv))
        assert jar.stdout.strip().endswith("statequery/spark/statequery-spark.jar")


def _pip_has_python_option() -> bool:
    done = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True,
                          text=True, check=True)
    major, minor = (int(x) for x in done.stdout.split()[1].split(".")[:2])
    return (major, minor) >= (22, 3)
