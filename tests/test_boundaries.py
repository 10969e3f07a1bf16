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
    assert users == [os.path.join("io", "fsspec.py")], users


def test_only_the_spark_package_imports_pyspark() -> None:
    users = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "pyspark" in _imports(p)
    )
    assert os.path.join("spark", "source.py") in users, users
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


# -- the import graph: no cycle, no upward arrow -------------------------------------------------

REPO = PACKAGE.parent
#: cycles allowed to remain (none: keep it so)
KNOWN_CYCLES: tuple[set[str], ...] = ()


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for p in sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.rglob("*.pyx")):
        parts = list(p.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods.setdefault(".".join(parts), p)
    return mods


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules of the package it imports: every import statement, at the top, in a
    function or under ``TYPE_CHECKING`` (``from package import module`` names the module)."""
    mods = _modules()

    def target(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        if path.suffix != ".py":
            continue
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out.update(t for a in node.names if (t := target(a.name)))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for a in node.names:
                    full = f"{module}.{a.name}"
                    t = full if full in mods else target(module)
                    if t:
                        out.add(t)
        out.discard(mod)
        graph[mod] = out
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    cycles = _cycles(_import_graph())
    new = [sorted(c) for c in cycles if not any(c <= known for known in KNOWN_CYCLES)]
    assert new == [], new


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [{"a", "b", "c"}]


def _layers() -> list[tuple[str, list[str]]]:
    """The layer stack of docs/architecture.md (bottom first): ``N name unit unit ...`` lines of
    the block under ``## Layers``; a unit is a module (``scan``) or a subpackage (``metadata/``)."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    layers = []
    for line in block.splitlines():
        fields = line.split()
        if fields and fields[0].isdigit():
            layers.append((fields[1], fields[2:]))
    return layers


def _unit(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1:
        return "__init__"
    if (PACKAGE / parts[1]).is_dir():
        return parts[1] + "/"
    return parts[1]


def test_every_import_follows_the_layers_of_the_architecture_doc() -> None:
    layers = _layers()
    level = {unit: i for i, (_, units) in enumerate(layers) for unit in units}
    graph = _import_graph()
    unplaced = sorted({_unit(m) for m in graph} - set(level))
    assert unplaced == [], f"modules in no layer of docs/architecture.md: {unplaced}"
    upward = sorted(
        f"{m} ({layers[level[_unit(m)]][0]}) -> {t} ({layers[level[_unit(t)]][0]})"
        for m, targets in graph.items()
        for t in targets
        if level[_unit(t)] > level[_unit(m)]
    )
    assert upward == [], upward
    assert len(layers) >= 8 and len(level) == sum(len(u) for _, u in layers)


def test_the_front_ends_stand_on_each_other_in_one_order() -> None:
    """The console script stands on the Spark package, which stands on the Spark-free front ends
    (the catalog, the SQL front end, the package face) and on ``serverinfo``: no arrow back up,
    e.g. ``spark/`` importing ``cli/``, passes the layer check above."""
    level = {unit: i for i, (_, units) in enumerate(_layers()) for unit in units}
    assert level["serverinfo"] < level["spark/"] < level["cli/"]
    assert level["catalog/"] < level["spark/"] and level["__init__"] < level["spark/"]
    graph = _import_graph()
    up = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                if _unit(m) == "spark/" and _unit(t) == "cli/")
    assert up == [], up


def test_the_layer_check_refuses_an_arrow_back_up() -> None:
    """The check above, on a graph with ``spark/`` importing ``cli/``: it names the arrow."""
    level = {unit: i for i, (_, units) in enumerate(_layers()) for unit in units}
    graph = {"statequery.spark.server": {"statequery.cli.output"}}
    upward = [f"{m} -> {t}" for m, ts in graph.items() for t in ts
              if level[_unit(t)] > level[_unit(m)]]
    assert upward == ["statequery.spark.server -> statequery.cli.output"]


#: packages whose face still holds code (split by their own engineers; emptied at merge)
UNSPLIT_FACES: tuple[str, ...] = ()
#: the most lines a package's ``__init__.py`` has: docstring, ``__all__``, re-exports
FACE_LINES = 60


def test_every_package_face_only_faces() -> None:
    faces = {
        str(p.parent.relative_to(PACKAGE)) or ".": len(p.read_text(encoding="utf-8").splitlines())
        for p in PACKAGE.rglob("__init__.py")
    }
    long = sorted(f"{pkg}/__init__.py: {n} lines" for pkg, n in faces.items()
                  if n > FACE_LINES and pkg not in UNSPLIT_FACES)
    assert long == [], long
    assert {"spark", "cli", "catalog"} <= set(faces)


def test_the_planner_and_the_model_import_no_front_end() -> None:
    graph = _import_graph()
    fronts = {"statequery.savepoint", "statequery.reader", "statequery", "statequery.sql"}
    for mod in ("statequery.scan", "statequery.metadata.model", "statequery.diff",
                "statequery.stats", "statequery.sources", "statequery.display",
                "statequery.ranges"):
        assert not graph[mod] & fronts, (mod, sorted(graph[mod] & fronts))


#: the programs tests start in a process of their own (not imported by a test module)
TEST_PROGRAMS = {"fuzz/fuzz_memory.py", "fuzz/run_campaign.py", "spark/cluster_job.py"}


def test_tests_mirror_the_package_and_helpers_live_in_support() -> None:
    """tests/ holds test modules in folders, shared helpers in tests/support/ and the programs a
    test starts: no helper beside the test modules (tests/README.md)."""
    tests = Path(__file__).resolve().parent
    top = sorted(p.name for p in tests.glob("*.py"))
    assert top == ["conftest.py", "test_boundaries.py", "test_hygiene.py"], top
    strays = sorted(
        str(p.relative_to(tests)) for p in tests.rglob("*.py")
        if not p.name.startswith("test_") and p.name not in ("conftest.py", "__init__.py")
        and "fixtures" not in p.relative_to(tests).parts
        and p.relative_to(tests).parts[0] != "support"
        and str(p.relative_to(tests)) not in TEST_PROGRAMS
    )
    assert strays == [], strays
