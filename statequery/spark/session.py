"""A local Spark for the ``statequery`` console script: one metastore that outlives the process.

``statequery attach``, ``statequery sql --spark`` and ``statequery shell`` share an embedded
(Derby) Hive metastore and a warehouse in a user-level folder, so a database attached by one
command is there for the next, and for any ``spark-sql`` started with :func:`spark_sql_conf`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["local_session", "spark_dir", "spark_sql_argv", "spark_sql_conf"]


def spark_dir(explicit: str | None = None) -> Path:
    """The folder of the metastore and warehouse: ``--spark-dir``, ``$STATEQUERY_SPARK_DIR``,
    or ``$XDG_DATA_HOME/statequery/spark`` (``~/.local/share/statequery/spark``)."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    if os.environ.get("STATEQUERY_SPARK_DIR"):
        return Path(os.environ["STATEQUERY_SPARK_DIR"]).expanduser().resolve()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base, "statequery", "spark").resolve()


def spark_sql_conf(folder: Path) -> dict[str, str]:
    """The Spark settings of the shared metastore and warehouse in ``folder``."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(folder / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL":
            f"jdbc:derby:;databaseName={folder / 'metastore_db'};create=true",
    }


def _driver_java_options(folder: Path) -> str:
    return f"-Dderby.system.home={folder}"  # derby.log there, not in the working directory


def _pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def spark_sql_argv(folder: Path, master: str = "local[*]") -> list[str]:
    """The ``spark-sql`` command line that opens the shared metastore."""
    argv = [str(_pyspark_home() / "bin" / "spark-sql"), "--master", master,
            "--driver-java-options", _driver_java_options(folder)]
    for key, value in spark_sql_conf(folder).items():
        argv += ["--conf", f"{key}={value}"]
    return argv


def local_session(folder: Path, master: str = "local[*]", app: str = "statequery") -> Any:
    """A local SparkSession on the shared metastore, with workers on this Python."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_HOME", str(_pyspark_home()))
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--driver-java-options {_driver_java_options(folder)} pyspark-shell"
    )
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app)
    for key, value in {**spark_sql_conf(folder), "spark.ui.showConsoleProgress": "false"}.items():
        builder = builder.config(key, value)
    session = builder.enableHiveSupport().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
