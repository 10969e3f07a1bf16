"""statequery's JVM data source for Spark: a jar built on this machine, on first use.

``statequery.DefaultSource`` (Java sources in ``statequery/spark/java``) is a DataSource V2
with columnar reads: Spark gets the Arrow batches of the statequery reader as
``ArrowColumnVector`` columns instead of rows, only the columns a query uses cross from Python
(none for ``count(*)``), and the planning and reading run in long-lived Python worker processes
(:mod:`statequery.spark.jvmworker`) that the JVM keeps from one query to the next. What a read
returns is the Python data source's own code (:mod:`statequery.spark`), so both paths give the
same rows.

Spark resolves ``format("statequery")`` and ``USING statequery`` to the class
``statequery.DefaultSource`` when it is on the class path, before any Python data source: add
the jar to a session and the same queries (and the persistent tables of ``statequery attach``)
take the JVM path; without it they take the Python data source. pip installs statequery without
a JDK or pyspark at hand, so the jar is compiled here with ``javac`` against the installed
pyspark's jars, into a user cache folder keyed by the Spark version and the sources.

    from statequery.spark.jvm import jar_path
    spark = SparkSession.builder.config("spark.jars", jar_path()).getOrCreate()
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = ["jar_path", "serve_auth_jar_path", "session_conf", "JAVA_SOURCES", "SERVE_SOURCES"]

#: the Java sources of the jar
JAVA_SOURCES = Path(__file__).resolve().parent / "java"

#: the Java source of ``statequery serve``'s Thrift password check, a jar of its own (on the
#: server's class path only: it does not put the JVM data source in the server's sessions)
SERVE_SOURCES = Path(__file__).resolve().parent / "java_serve"

#: set to ``python`` to keep statequery's own Spark sessions on the Python data source
PATH_ENV = "STATEQUERY_SPARK_PATH"

_warned = False


def _cache_root() -> Path:
    base = os.environ.get("STATEQUERY_CACHE") or os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "statequery" if base else Path.home() / ".cache" / "statequery"


def _pyspark() -> tuple[str, Path]:
    import pyspark

    return pyspark.__version__, Path(pyspark.__file__).resolve().parent / "jars"


def _sources(root: Path = JAVA_SOURCES) -> list[Path]:
    return sorted(root.rglob("*.java"))


def _key(spark_version: str, sources: list[Path], root: Path = JAVA_SOURCES) -> str:
    digest = hashlib.sha256(spark_version.encode())
    for path in sources:
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _say(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        print(f"statequery: {message}", file=sys.stderr, flush=True)


def jar_path(build: bool = True) -> str | None:
    """The jar of ``statequery.DefaultSource`` for the installed pyspark, built if needed
    (``build``): its path, or None (no ``javac``, or the build failed; said in one line on
    standard error) -- Spark then uses the Python data source."""
    return _jar(JAVA_SOURCES, "statequery-spark", build)


def serve_auth_jar_path() -> str | None:
    """The jar of ``statequery.serve.TokenAuthenticator`` (the Thrift server's password check of
    ``statequery serve``) for the installed pyspark, built if needed; None without ``javac``."""
    return _jar(SERVE_SOURCES, "statequery-serve-auth", True, quiet=True)


def _jar(root: Path, name: str, build: bool, quiet: bool = False) -> str | None:
    """The jar ``name`` of the Java sources under ``root`` (built with ``javac`` if needed and
    ``build``), or None; ``quiet``: the caller says why not itself."""
    try:
        spark_version, jars = _pyspark()
    except ImportError:
        return None
    sources = _sources(root)
    if not sources:
        return None
    key = _key(spark_version, sources, root)
    folder = _cache_root() / "spark-jvm" / f"spark-{spark_version}-{key}"
    jar = folder / f"{name}.jar"
    if jar.is_file():
        return str(jar)
    if not build:
        return None
    javac = shutil.which("javac", path=_java_path())
    if javac is None:
        if quiet:
            return None
        _say("no javac (a JDK 17+) on PATH or in JAVA_HOME: Spark reads statequery through the "
             "Python data source (slower); install a JDK for the columnar JVM data source")
        return None
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=folder) as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8",
               "-cp", str(jars / "*"), "-d", str(classes), *map(str, sources)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            if quiet:
                return None
            detail = (out.stderr or out.stdout).strip().splitlines()
            _say("building the statequery Spark jar failed "
                 f"({detail[0] if detail else 'javac exit ' + str(out.returncode)}): Spark "
                 "reads statequery through the Python data source")
            return None
        partial = Path(tmp) / jar.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                z.write(path, path.relative_to(classes).as_posix())
        os.replace(partial, jar)  # atomic: a concurrent build writes the same bytes
    return str(jar)


def _java_path() -> str:
    path = os.environ.get("PATH", os.defpath)
    home = os.environ.get("JAVA_HOME")
    return os.pathsep.join([str(Path(home) / "bin"), path]) if home else path


def session_conf(enabled: bool | None = None) -> dict[str, str]:
    """The Spark settings that put statequery's JVM data source in a new session: ``spark.jars``
    (added to what ``existing`` settings list) and the Python of its workers. Empty when the
    jar cannot be built, or ``STATEQUERY_SPARK_PATH=python`` (``enabled`` None)."""
    if enabled is None:
        enabled = os.environ.get(PATH_ENV, "").lower() != "python"
    if not enabled:
        return {}
    jar = jar_path()
    if jar is None:
        return {}
    return {"spark.jars": jar, "spark.statequery.python": sys.executable}
