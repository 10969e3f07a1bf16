"""A local Spark for the ``statequery`` console script: one metastore that outlives the process.

``statequery attach``, ``statequery sql --spark`` and ``statequery shell`` share an embedded
(Derby) Hive metastore and a warehouse in a user-level folder, so a database attached by one
command is there for the next, and for any ``spark-sql`` started with :func:`spark_sql_conf`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from statequery.serverinfo import folder_conf, spark_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "local_session",
    "metastore_holder",
    "folder_conf",
    "spark_dir",
    "spark_sql_argv",
    "spark_sql_conf",
    "stop_session",
]


def spark_sql_conf(folder: Path) -> dict[str, str]:
    """The Spark settings of the shared metastore and warehouse in ``folder``: an embedded
    Derby metastore there, unless ``folder/spark-defaults.conf`` says otherwise
    (:func:`folder_conf`)."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(folder / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL":
            f"jdbc:derby:;databaseName={folder / 'metastore_db'};create=true",
        **folder_conf(folder),
    }


def _driver_java_options(folder: Path) -> str:
    return f"-Dderby.system.home={folder}"  # derby.log there, not in the working directory


def _pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def spark_sql_argv(folder: Path, master: str = "local[*]") -> list[str]:
    """The ``spark-sql`` command line that opens the shared metastore (with statequery's JVM
    data source when its jar can be built: :func:`statequery.spark.jvm.session_conf`)."""
    argv = [str(_pyspark_home() / "bin" / "spark-sql"), "--master", master,
            "--driver-java-options", _driver_java_options(folder)]
    for key, value in _with_jar(spark_sql_conf(folder)).items():
        argv += ["--conf", f"{key}={value}"]
    return argv


def _with_jar(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with statequery's JVM data source added (its jar after any ``spark.jars``)."""
    from statequery.spark.jvm import session_conf

    extra = session_conf()
    out = {**extra, **conf}
    if "spark.jars" in extra and conf.get("spark.jars"):
        out["spark.jars"] = f"{conf['spark.jars']},{extra['spark.jars']}"
    return out


def local_session(
    folder: Path, master: str = "local[*]", app: str = "statequery",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A local SparkSession on the shared metastore, with workers on this Python and
    statequery's JVM data source when its jar can be built (``conf``: more Spark settings)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_HOME", str(_pyspark_home()))
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--driver-java-options {_driver_java_options(folder)} pyspark-shell"
    )
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app)
    settings = _with_jar(
        {**spark_sql_conf(folder), "spark.ui.showConsoleProgress": "false", **(conf or {})}
    )
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.enableHiveSupport().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def stop_session(session: SparkSession, timeout: float = 60.0) -> None:
    """Stop ``session`` and the JVM behind it, and wait until that JVM has exited.

    ``SparkSession.stop()`` leaves PySpark's JVM running, and that JVM keeps the embedded Derby
    metastore booted (locked): a ``spark-sql`` started after it on the same metastore fails with
    ``XSDB6: Another instance of Derby may have already booted the database``. The JVM exits when
    its standard input closes (PySpark's gateway watches it).
    """
    import subprocess

    from pyspark import SparkContext

    gateway = SparkContext._gateway
    session.stop()
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:  # noqa: BLE001 - the JVM may be gone already
        pass
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None:
        return
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout=timeout)


def metastore_holder(folder: Path) -> str | None:
    """Who holds the embedded Derby metastore in ``folder`` (one line), or None when nobody does.

    Derby locks ``metastore_db/dbex.lck`` while a JVM has the database booted; one JVM at a time
    can. Linux lists the lock's process in ``/proc/locks``; elsewhere only the lock is tested.
    """
    import fcntl

    lock = folder / "metastore_db" / "dbex.lck"
    if not lock.exists():
        return None
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # held
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
    return _lock_owner(lock) or "another process"


def _lock_owner(lock: Path) -> str | None:
    try:
        st = lock.stat()
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"
        if len(parts) >= 6 and parts[5].rsplit(":", 1)[-1] == str(st.st_ino):
            pid = parts[4]
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                return f"process {pid}"
            return f"process {pid} ({_describe(cmd)})"
    return None


def _describe(cmd: list[bytes]) -> str:
    """A Java command line as what it runs: spark-sql, a PySpark session, a server, ..."""
    args = [a.decode(errors="replace") for a in cmd if a]
    joined = " ".join(args)
    for marker, name in (
        ("SparkSQLCLIDriver", "spark-sql"),
        ("HiveThriftServer2", "the Spark Thrift server"),
        ("SparkConnectServer", "the Spark Connect server"),
        ("pyspark-shell", "a PySpark session"),
    ):
        if marker in joined:
            return name
    return (args[0] if args else "?")[:80]
