"""The Spark jar a wheel ships: built when the wheel is built (setup.py calls
``build_shipped_jar``), used with no ``javac`` on the machine (a node with a JRE only) when it
was built for the installed Spark's major.minor version from the same sources; a jar built for
another Spark is not used (first-use compile, or the Python data source without javac)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from statequery.spark import jvm


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheel") / "statequery" / "spark"
    folder.mkdir(parents=True)
    assert jvm.build_shipped_jar(folder) is None  # javac and pyspark's jars are here
    return folder


def _jre_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, folder: Path) -> None:
    monkeypatch.setenv("STATEQUERY_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no javac
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(jvm, "SHIPPED_JAR", folder / "statequery-spark.jar")
    monkeypatch.setattr(jvm, "SHIPPED_INFO", folder / "statequery-spark.json")
    monkeypatch.setattr(jvm, "_warned", False)


def test_the_built_jar_holds_the_data_source_and_says_what_it_was_built_for(
        shipped: Path) -> None:
    import pyspark

    names = zipfile.ZipFile(shipped / "statequery-spark.jar").namelist()
    assert "statequery/DefaultSource.class" in names
    info = json.loads((shipped / "statequery-spark.json").read_text())
    assert info["spark"] == pyspark.__version__
    assert info["sources"] == jvm._sources_digest(jvm._sources())


def test_a_jre_only_machine_uses_the_shipped_jar(
        shipped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _jre_only(monkeypatch, tmp_path, shipped)
    assert jvm.jar_path() == str(shipped / "statequery-spark.jar")
    assert jvm.session_conf()["spark.jars"] == str(shipped / "statequery-spark.jar")
    assert capsys.readouterr().err == ""  # no "no javac" notice
    assert not (tmp_path / "empty-cache").exists()  # nothing compiled


def test_a_jar_built_for_another_spark_is_not_used(
        shipped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "statequery-spark.jar").write_bytes((shipped / "statequery-spark.jar").read_bytes())
    info = json.loads((shipped / "statequery-spark.json").read_text())
    (other / "statequery-spark.json").write_text(json.dumps(dict(info, spark="3.5.1")))
    _jre_only(monkeypatch, tmp_path, other)
    assert jvm.jar_path() is None  # no javac to build one for this Spark
    assert "no javac" in capsys.readouterr().err
    # nor one built from other sources
    (other / "statequery-spark.json").write_text(json.dumps(dict(info, sources="0" * 16)))
    assert jvm.jar_path() is None


def test_setup_py_builds_it_into_the_wheel() -> None:
    setup = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert "jvm.build_shipped_jar(Path(folder))" in setup
    assert '_build_spark_jar(os.path.join(self.build_lib, "statequery", "spark"))' in setup
