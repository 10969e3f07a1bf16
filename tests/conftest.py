"""Shared test fixtures: the committed, Flink-written savepoints under tests/fixtures/."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# CI (CI=true) runs the property tests with a fixed derivation of examples, so a submission's
# result does not depend on the draw; local runs explore new random examples every time.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

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
