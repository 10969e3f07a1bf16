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
take the JVM path; without it they take the Python data source.

Where the jar comes from, in order:

1. the wheel: ``setup.py`` compiles it when the wheel is built with ``javac`` and Spark's jars
   at hand (pyspark in the build environment, or ``$STATEQUERY_SPARK_JARS``) and ships it here
   as ``statequery-spark.jar``, with ``statequery-spark.json`` saying the Spark version and the
   sources it was built from; it is used with a pyspark of the same major.minor version, so
   machines with a JRE only (cluster nodes) need no ``javac``;
2. a jar built earlier on this machine, in a user cache folder keyed by the Spark version and
   the sources;
3. else it is compiled now with ``javac`` against the installed pyspark's jars, into that cache.

    from statequery.spark.jvm import jar_path
    spark = SparkSession.builder.config("spark.jars", jar_path()).getOrCreate()
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = [
    "JAVA_SOURCES", "SERVE_SOURCES", "SHIPPED_JAR", "build_shipped_jar", "jar_path",
    "serve_auth_jar_path", "session_conf",
]

#: the Java sources of the jar
JAVA_SOURCES = Path(__file__).resolve().parent / "java"
#: the jar a wheel ships (setup.py builds it when the wheel is built), and what it was built from
SHIPPED_JAR = Path(__file__).resolve().parent / "statequery-spark.jar"
SHIPPED_INFO = SHIPPED_JAR.with_suffix(".json")
#: a folder of Spark's jars to build the shipped jar against (else the build's pyspark)
SPARK_JARS_ENV = "STATEQUERY_SPARK_JARS"

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


def _sources_digest(sources: list[Path]) -> str:
    return _key("", sources)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _shipped(spark_version: str, sources: list[Path]) -> str | None:
    """The wheel's jar, when it was built for this Spark (major.minor) from these sources."""
    try:
        info = json.loads(SHIPPED_INFO.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(info, dict) and SHIPPED_JAR.is_file()):
        return None
    if info.get("sources") != _sources_digest(sources):
        return None
    if _minor(str(info.get("spark", ""))) != _minor(spark_version):
        return None
    return str(SHIPPED_JAR)


def jar_path(build: bool = True) -> str | None:
    """The jar of ``statequery.DefaultSource`` for the installed pyspark: the wheel's, one built
    earlier, or (``build``) one built now. Its path, or None (no ``javac``, or the build failed;
    said in one line on standard error) -- Spark then uses the Python data source."""
    return _jar(JAVA_SOURCES, "statequery-spark", build)


def serve_auth_jar_path() -> str | None:
    """The jar of ``statequery.serve.TokenAuthenticator`` (the Thrift server's password check of
    ``statequery serve``) for the installed pyspark, built if needed; None without ``javac``."""
    return _jar(SERVE_SOURCES, "statequery-serve-auth", True, quiet=True)


def _jar(root: Path, name: str, build: bool, quiet: bool = False) -> str | None:
    """The jar ``name`` of the Java sources under ``root`` (built with ``javac`` if needed and
    ``build``), or None; ``quiet``: the caller says why not itself. The wheel ships the data
    source's jar (``SHIPPED_JAR``), taken when built for this Spark from these sources."""
    try:
        spark_version, jars = _pyspark()
    except ImportError:
        return None
    sources = _sources(root)
    if not sources:
        return None
    if root == JAVA_SOURCES:
        shipped = _shipped(spark_version, sources)
        if shipped is not None:
            return shipped
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
    failed = _compile(javac, jars, sources, jar)
    if failed is not None:
        if quiet:
            return None
        _say(f"building the statequery Spark jar failed ({failed}): Spark reads statequery "
             "through the Python data source")
        return None
    return str(jar)


def _compile(javac: str, jars: Path, sources: list[Path], jar: Path) -> str | None:
    """Compile ``sources`` against Spark's ``jars`` into ``jar`` (replaced atomically); None, or
    the first line of what went wrong."""
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=jar.parent) as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8",
               "-cp", str(jars / "*"), "-d", str(classes), *map(str, sources)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            detail = (out.stderr or out.stdout).strip().splitlines()
            return detail[0] if detail else f"javac exit {out.returncode}"
        partial = Path(tmp) / jar.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                z.write(path, path.relative_to(classes).as_posix())
        os.replace(partial, jar)  # atomic: a concurrent build writes the same bytes
    return None


def _spark_jars_for_build() -> tuple[str, Path]:
    """Spark's version and jars to build the shipped jar against: ``$STATEQUERY_SPARK_JARS``
    (its ``spark-core_*`` jar names the version), else the build environment's pyspark."""
    given = os.environ.get(SPARK_JARS_ENV)
    if not given:
        return _pyspark()
    jars = Path(given)
    for core in sorted(jars.glob("spark-core_*.jar")):
        m = re.fullmatch(r"spark-core_[\d.]+-(\d+\.\d+\.\d+.*)\.jar", core.name)
        if m:
            return m.group(1), jars
    raise ImportError(f"{SPARK_JARS_ENV}={given}: no spark-core_*.jar there")


def build_shipped_jar(folder: Path) -> str | None:
    """Build the jar a wheel ships into ``folder`` (``statequery-spark.jar`` and
    ``statequery-spark.json``), as ``setup.py`` does when the wheel is built. None when built,
    else why not (no ``javac``, no Spark jars, ...): the wheel then compiles it on first use."""
    try:
        spark_version, jars = _spark_jars_for_build()
    except ImportError as e:
        return f"no Spark jars to build against ({e}; install pyspark in the build environment "\
               f"or set {SPARK_JARS_ENV})"
    sources = _sources()
    if not sources:
        return "no Java sources"
    javac = shutil.which("javac", path=_java_path())
    if javac is None:
        return "no javac (a JDK 17+) on PATH or in JAVA_HOME"
    failed = _compile(javac, jars, sources, folder / SHIPPED_JAR.name)
    if failed is not None:
        return f"javac failed: {failed}"
    info = {"spark": spark_version, "sources": _sources_digest(sources)}
    (folder / SHIPPED_INFO.name).write_text(json.dumps(info) + "\n", encoding="utf-8")
    return None


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


def main() -> int:
    """``python -m statequery.spark.jvm``: print the jar's path (for ``spark.jars``,
    ``--jars``), building it if needed; exit 1 when there is none."""
    jar = jar_path()
    if jar is None:
        return 1
    print(jar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
