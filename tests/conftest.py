"""Shared test fixtures: the committed, Flink-written savepoints under tests/fixtures/."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# CI (CI=true) runs the property tests with a fixed derivation of examples, so a submission's
# result does not depend on the draw; local runs explore new random examples every time.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Every Spark JVM the tests start (PySpark's local sessions, spark-sql, `statequery sql --spark`,
# `shell`, `serve`, the standalone cluster's driver) is launched by spark-submit, which adds
# SPARK_SUBMIT_OPTS to the java command line. The tests' Spark jobs are small and short: the
# JIT's first tier only and the serial collector (no C2 or parallel-GC threads competing for two
# cores) take about 40% less CPU per start (docs/testing.md). Only when the user set none.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

FIXTURES = Path(__file__).parent / "fixtures"
MANIFEST = FIXTURES / "manifest.json"


def load_manifest() -> dict[str, Any]:
    """The fixture manifest (docs/fixtures.md). Missing is an error, never a skip."""
    with open(MANIFEST, encoding="utf-8") as f:
        return json.load(f)  # type: ignore[no-any-return]


def fixture_records() -> list[dict[str, Any]]:
    return list(load_manifest()["fixtures"])


def fixture_names() -> list[str]:
    return [r["name"] for r in fixture_records()]


def fixture_record(name: str) -> dict[str, Any]:
    for r in fixture_records():
        if r["name"] == name:
            return r
    raise KeyError(name)


def fixture_dir(name: str) -> Path:
    """The directory that holds the fixture's ``_metadata``."""
    return FIXTURES / fixture_record(name)["path"]


def fixture_classpath(name: str) -> list[str] | None:
    """The job's jar beside a fixture's snapshot (``<fixture>/job.jar``: the types-kryo-*
    fixtures), the ``classpath`` to open it with; None when it has none."""
    jar = FIXTURES / fixture_record(name)["path"].split("/")[0] / "job.jar"
    return [str(jar)] if jar.is_file() else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def expected_entries(name: str) -> list[dict[str, Any]]:
    return read_jsonl(FIXTURES / "expected" / f"{name}.jsonl")


def dump_entries(name: str) -> list[dict[str, Any]]:
    return read_jsonl(FIXTURES / "dump" / f"{name}.jsonl")


@pytest.fixture(scope="session")
def manifest() -> dict[str, Any]:
    return load_manifest()


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Tests (and the subprocesses and Spark workers they start) never touch the user's
    ``~/.cache/statequery``: the RocksDB file cache goes to a folder of the test session."""
    saved = os.environ.get("STATEQUERY_CACHE_DIR")
    os.environ["STATEQUERY_CACHE_DIR"] = str(tmp_path_factory.mktemp("statequery-cache"))
    yield
    if saved is None:
        os.environ.pop("STATEQUERY_CACHE_DIR", None)
    else:
        os.environ["STATEQUERY_CACHE_DIR"] = saved


@pytest.fixture(scope="session", autouse=True)
def _no_inherited_terminal_size() -> Any:
    """pytest-xdist workers inherit ``COLUMNS``/``LINES`` of the controlling terminal (80 when it
    has none); the CLI would then draw its tables for that width. Tests see what a pipe sees
    unless they set a width themselves."""
    saved = {name: os.environ.pop(name) for name in ("COLUMNS", "LINES") if name in os.environ}
    yield
    os.environ.update(saved)


@pytest.fixture(params=["compiled", "pure"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on the compiled decode path and on the pure-Python reference
    (statequery.backends.fastpath); the compiled one must be built unless
    STATEQUERY_NO_EXTENSIONS is set (as for the build itself)."""
    from statequery.backends import fastpath

    if request.param == "pure":
        monkeypatch.setenv(fastpath.PURE_ENV, "1")
    else:
        monkeypatch.delenv(fastpath.PURE_ENV, raising=False)
        if not os.environ.get("STATEQUERY_NO_EXTENSIONS"):
            assert fastpath.compiled() is not None, "statequery.backends._read was not built"
    return str(request.param)


# --- Spark: one local session per test process --------------------------------------------------
#
# Starting a local Spark (a JVM) costs 10-30 s; the in-process Spark tests used to start one per
# module. They now share one session per test process (each pytest-xdist worker has its own),
# started on first use. A test module asks for it with the ``spark`` fixture (module scope):
#
#     def test_x(spark) -> None:
#         spark.read.format("statequery").load(...)
#
# Isolation: when the module is done, ``spark`` undoes what its tests left in the session --
# runtime settings set or changed (``spark.conf.set``), databases, tables and views created,
# temporary views, cached data -- so the next module sees the session as it was started.
# Settings a module needs for all its tests go in a module fixture over ``spark`` that sets them
# (``spark.conf.set``); they are undone at the end of the module. Static settings (``spark.jars``,
# the master, the warehouse) are those of ``_SPARK_CONF`` for every module: a test that needs other
# static settings starts a Spark of its own (a subprocess, as the CLI tests do), never
# ``SparkSession.builder...getOrCreate()`` in this process (that returns the shared session, and
# its ``stop()`` would end it: the next module then gets a new one, at the cost of a start).

_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
}
_spark_state: dict[str, Any] = {}


def _shared_spark(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The process's local[2] session with statequery's JVM data source, (re)started if none
    runs (a test may have stopped it)."""
    session = _spark_state.get("session")
    if session is not None and session.sparkContext._jsc is not None:
        return session
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from statequery.spark.jvm import session_conf as jvm_session_conf

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    builder = SparkSession.builder.master("local[2]").appName("statequery-tests")
    for key, value in {**_SPARK_CONF, "spark.sql.warehouse.dir": str(warehouse),
                       **jvm_session_conf()}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    _spark_state["session"] = session
    _spark_state["warehouse"] = warehouse
    return session


def _spark_tables(session: Any, database: str) -> set[tuple[str, bool]]:
    """(name, temporary) of the tables and views in ``database`` (SHOW TABLES: names only,
    no table is resolved)."""
    return {(r["tableName"], bool(r["isTemporary"]))
            for r in session.sql(f"SHOW TABLES IN `{database}`").collect()}


def _spark_snapshot(session: Any) -> dict[str, Any]:
    databases = {d.name for d in session.catalog.listDatabases()}
    return {
        "conf": dict(session.conf.getAll),
        "databases": databases,
        "tables": {(db, t) for db in databases for t, temp in _spark_tables(session, db)
                   if not temp},
        "temp": {t for t, temp in _spark_tables(session, "default") if temp},
    }


def _spark_restore(session: Any, before: dict[str, Any]) -> None:
    """Undo what a module left in the shared session (see above)."""
    catalog = session.catalog
    catalog.clearCache()
    catalog.setCurrentDatabase("default")
    for name in {t for t, temp in _spark_tables(session, "default") if temp} - before["temp"]:
        catalog.dropTempView(name)
    databases = {d.name for d in catalog.listDatabases()}
    for db in sorted(databases - before["databases"]):
        session.sql(f"DROP DATABASE IF EXISTS `{db}` CASCADE")
    for db in sorted(databases & before["databases"]):
        for t, temp in _spark_tables(session, db):
            if not temp and (db, t) not in before["tables"]:
                try:
                    session.sql(f"DROP TABLE IF EXISTS `{db}`.`{t}`")
                except Exception:  # a view: DROP TABLE refuses it
                    session.sql(f"DROP VIEW IF EXISTS `{db}`.`{t}`")
    after = dict(session.conf.getAll)
    for key in after.keys() - before["conf"].keys():
        try:
            session.conf.unset(key)
        except Exception:  # a static or core setting is not the module's to undo
            pass
    for key, value in before["conf"].items():
        if after.get(key) != value:
            try:
                session.conf.set(key, value)
            except Exception:
                pass


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The shared local Spark session (see above), as a module found it and left for the next."""
    session = _shared_spark(tmp_path_factory)
    before = _spark_snapshot(session)
    yield session
    if session.sparkContext._jsc is not None:  # the module did not stop it
        _spark_restore(session, before)


@pytest.fixture(scope="module")
def spark_warehouse(spark: Any) -> Path:
    """The shared session's ``spark.sql.warehouse.dir`` (a temporary folder of the run)."""
    return Path(_spark_state["warehouse"])


@pytest.fixture(scope="session", autouse=True)
def _stop_shared_spark() -> Any:
    yield
    session = _spark_state.pop("session", None)
    if session is not None:
        session.stop()


# --- Scheduling: the longest modules first -------------------------------------------------------
#
# `--dist loadscope` sends whole modules to the workers. pytest-xdist sorts them by *test count*
# by default, which put the modules with few but long tests (Spark servers and shells, the
# checked build, the Flink cluster, wheel builds) last: one of them started at the end kept one
# worker busy alone. pytest_configure below turns that sorting off (as --no-loadscope-reorder
# does), so xdist takes the modules in the order collected here: longest first, and the workers
# end within about one short module of each other. The figures are
# relative weights (seconds of one module, from a timed run, docs/testing.md); a module not listed
# weighs 0.1 s per test. New long modules belong in the table.
_MODULE_SECONDS: dict[str, float] = {
    # a -n 2 run at load 12-20 on 2 cores (docs/testing.md); * estimated from single-module runs
    "tests/backends/test_sanitized.py": 1250,
    "tests/spark/test_attach.py": 800,  # *
    "tests/reader/test_reader.py": 650,
    "tests/keys/test_key_roundtrip.py": 570,
    "tests/spark/test_datasource.py": 350,  # *
    "tests/spark/test_server.py": 300,  # *
    "tests/spark/test_shell.py": 300,  # *
    "tests/reader/test_edge_fixtures.py": 300,
    "tests/backends/test_fastpath.py": 285,
    "tests/backends/test_corruption.py": 255,
    "tests/metadata/test_runindex.py": 175,
    "tests/spark/test_stale_reader.py": 150,
    "tests/spark/test_pg_metastore.py": 150,  # *
    "tests/capture/test_capture_live.py": 150,  # *
    "tests/reader/test_read_operator.py": 150,
    "tests/spark/test_jvm_source.py": 150,
    "tests/reader/test_fixture_oracle.py": 140,
    "tests/keys/test_hashing.py": 130,
    "tests/reader/test_savepoint.py": 130,
    "tests/backends/test_rocksdb_tables.py": 105,
    "tests/metadata/test_statemeta.py": 100,
    "tests/product/test_install.py": 95,
    "tests/metadata/test_checkpoint.py": 80,
    "tests/capture/test_capture.py": 75,
    "tests/spark/test_cluster.py": 70,
    "tests/cli/test_no_traceback.py": 68,
    "tests/io/test_s3.py": 67,
}


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules longest first (see above); a module's tests keep their order."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        module = _module_of(item)
        counts[module] = counts.get(module, 0) + 1
        first.setdefault(module, i)

    def weight(module: str) -> float:
        return _MODULE_SECONDS.get(module, 0.1 * counts[module])

    items.sort(key=lambda item: (-weight(_module_of(item)), first[_module_of(item)]))


def pytest_configure(config: pytest.Config) -> None:
    # xdist (when installed and active) keeps the collection order of the modules (see above)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
