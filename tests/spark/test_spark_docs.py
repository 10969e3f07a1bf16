"""What docs/spark.md gives to copy can be copied as it is: the PostgreSQL metastore settings
name every persistent class of the Hive metastore, as pyspark's hive-metastore jar lists them
(no ``MDatabase,...`` to complete by hand). Reads the jar as a zip: no JVM."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

from statequery.serverinfo import folder_conf

ROOT = Path(__file__).resolve().parents[2]


def _hive_model_classes() -> list[str]:
    from statequery.spark.jvm import _pyspark

    _, jars = _pyspark()
    jar = next(jars.glob("hive-metastore-*.jar"))
    with zipfile.ZipFile(jar) as z:
        jdo = z.read("package.jdo").decode()
    package = re.search(r'<package name="([^"]+)"', jdo)
    assert package is not None
    return [f"{package.group(1)}.{name}" for name in re.findall(r'<class name="(\w+)"', jdo)]


def _postgres_block() -> str:
    text = (ROOT / "docs" / "spark.md").read_text(encoding="utf-8")
    blocks = [b for _, b in re.findall(r"^ *```([a-z]*)\n(.*?)^ *```", text, re.S | re.M)
              if "jdbc:postgresql:" in b and "autoStartClassNames" in b]
    assert len(blocks) == 1
    return str(blocks[0])


def test_the_postgresql_settings_are_complete_as_written(tmp_path: Path) -> None:
    (tmp_path / "spark-defaults.conf").write_text(_postgres_block())
    conf = folder_conf(tmp_path)  # as every Spark command of statequery reads them
    names = conf["spark.hadoop.datanucleus.autoStartClassNames"].split(",")
    assert names == _hive_model_classes()
    assert len(names) == 30
    assert not [v for v in conf.values() if "..." in v]
    assert conf["spark.hadoop.datanucleus.autoStartMechanism"] == "Classes"
