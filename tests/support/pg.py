"""A PostgreSQL server on loopback for one test module: its own data folder, a bounded life.

Debian's ``postgresql`` (``initdb`` and ``postgres`` from ``/usr/lib/postgresql/<version>/bin``)
and the JDBC driver of ``libpostgresql-jdbc-java`` (``/usr/share/java/postgresql.jar``).
PostgreSQL refuses to run as root: as root, the folder is handed to the ``postgres`` user and the
server runs as that user.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
#: the server ends by itself after this many seconds, whatever happens to the test
LIFETIME = 1200


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("postgres") or shutil.which("initdb")
    return Path(which).resolve().parent if which else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def postgres(database: str = "metastore") -> Iterator[dict[str, str | int]]:
    """A running PostgreSQL with an empty ``database``; yields its host, port, user and JDBC URL,
    and stops it (fast shutdown) at the end."""
    bindir = postgres_bin()
    assert bindir is not None, "PostgreSQL is not installed (apt-get install postgresql)"
    folder = Path(tempfile.mkdtemp(prefix="statequery-pg-"))
    data = folder / "data"
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
    subprocess.run(_as_postgres([str(bindir / "initdb"), "-D", str(data), "-U", user,
                                 "--auth=trust", "-E", "UTF8", "--no-sync"]),
                   check=True, capture_output=True, timeout=300)
    port = _free_port()
    log = open(folder / "postgres.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        _as_postgres(["timeout", "-s", "INT", str(LIFETIME), str(bindir / "postgres"),
                      "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(folder),
                      "-c", "fsync=off", "-c", "max_connections=200"]),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            ready = subprocess.run([str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p",
                                    str(port)], capture_output=True)
            if ready.returncode == 0:
                break
            assert proc.poll() is None, (folder / "postgres.log").read_text()
            assert time.monotonic() < deadline, "PostgreSQL did not start in 120 s"
            time.sleep(0.3)
        subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user,
                        database], check=True, capture_output=True, timeout=60)
        yield {"host": "127.0.0.1", "port": port, "user": user, "database": database,
               "url": f"jdbc:postgresql://127.0.0.1:{port}/{database}",
               "psql": f"{bindir / 'psql'}"}
    finally:
        # the postmaster's pid is in postmaster.pid (timeout runs it in a process group of
        # its own): SIGINT is PostgreSQL's fast shutdown
        try:
            postmaster = int((data / "postmaster.pid").read_text().split()[0])
            os.kill(postmaster, signal.SIGINT)
        except (OSError, ValueError, IndexError):
            pass
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def _hive_model_classes() -> list[str]:
    """The persistent classes of the Hive metastore (``package.jdo`` of pyspark's
    hive-metastore jar)."""
    import re
    import zipfile

    from statequery.spark.session import _pyspark_home

    jar = next((_pyspark_home() / "jars").glob("hive-metastore-*.jar"))
    with zipfile.ZipFile(jar) as z:
        jdo = z.read("package.jdo").decode()
    package = re.search(r'<package name="([^"]+)"', jdo)
    assert package is not None
    return [f"{package.group(1)}.{name}" for name in re.findall(r'<class name="(\w+)"', jdo)]


def metastore_conf(info: dict[str, str | int]) -> str:
    """``spark-defaults.conf`` lines of a Hive metastore on this PostgreSQL (docs/spark.md)."""
    return "\n".join([
        f"spark.hadoop.javax.jdo.option.ConnectionURL {info['url']}",
        "spark.hadoop.javax.jdo.option.ConnectionDriverName org.postgresql.Driver",
        f"spark.hadoop.javax.jdo.option.ConnectionUserName {info['user']}",
        "spark.hadoop.datanucleus.schema.autoCreateAll true",
        "spark.hadoop.hive.metastore.schema.verification false",
        "spark.hadoop.datanucleus.autoStartMechanism Classes",
        "spark.hadoop.datanucleus.autoStartClassNames " + ",".join(_hive_model_classes()),
        f"spark.driver.extraClassPath {JDBC_JAR}",
    ]) + "\n"
