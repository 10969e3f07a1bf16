"""Build steps beyond pyproject.toml's metadata:

* ships the example catalog (``catalog/``) inside the package as ``statequery/_catalog`` when a
  wheel is built (editable installs find ``catalog/`` in the checkout instead,
  statequery.discovery.default_catalog);
* builds the Spark jar (``statequery.DefaultSource``, sources in ``statequery/spark/java``) into
  the package as ``statequery/spark/statequery-spark.jar`` when a wheel is built with ``javac``
  and Spark's jars at hand (pyspark in the build environment, e.g. ``pip wheel
  --no-build-isolation``, or ``$STATEQUERY_SPARK_JARS``); without them the wheel is built with a
  one-line notice and ``statequery.spark.jvm`` compiles the jar on first use, as before;
* compiles the optional decode path (``statequery/backends/_read.pyx``) and the SST reader's
  block walk (``statequery/backends/_sst.pyx``). It is optional: without
  a C compiler (or Cython), or when compiling fails, the package installs with a one-line notice
  and uses the pure-Python path (identical tables, slower).

``STATEQUERY_BOUNDSCHECK=1`` builds the memory-checked variant instead (tests only, see
docs/testing.md): Cython's ``boundscheck``, ``wraparound`` and ``initializedcheck`` on, and gcc's
AddressSanitizer and UndefinedBehaviorSanitizer (``-fsanitize=address,undefined``). Its C sources
go to ``build/boundscheck/``; build it into a directory of its own with
``python setup.py build_ext --build-lib DIR`` (tests/backends/test_sanitized.py does) and run Python with
``LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
NOTICE = "statequery: compiled decode path not built ({}); using the pure-Python path"
JAR_NOTICE = "statequery: Spark jar not built into the package ({}); it is compiled on first use"
BOUNDSCHECK_ENV = "STATEQUERY_BOUNDSCHECK"


class BuildPyWithCatalog(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        source = os.path.join(ROOT, "catalog")
        if os.path.isdir(source) and not self.editable_mode:
            target = os.path.join(self.build_lib, "statequery", "_catalog")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(".*", "__pycache__"))
        if not self.editable_mode:
            _build_spark_jar(os.path.join(self.build_lib, "statequery", "spark"))


def _build_spark_jar(folder: str) -> None:
    """The Spark jar into ``folder`` (statequery.spark.jvm.build_shipped_jar, loaded from its
    file: the package's other modules need dependencies a build environment may not have)."""
    if os.environ.get("STATEQUERY_NO_SPARK_JAR"):
        print(JAR_NOTICE.format("STATEQUERY_NO_SPARK_JAR is set"), file=sys.stderr)
        return
    path = os.path.join(ROOT, "statequery", "spark", "jvm.py")
    spec = importlib.util.spec_from_file_location("_statequery_build_jvm", path)
    if spec is None or spec.loader is None:
        return
    jvm = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(jvm)
        os.makedirs(folder, exist_ok=True)
        why_not = jvm.build_shipped_jar(Path(folder))
    except Exception as e:  # never fail the build for the optional jar
        why_not = f"{type(e).__name__}: {e}"
    if why_not:
        print(JAR_NOTICE.format(why_not), file=sys.stderr)


def _checked() -> bool:
    return os.environ.get(BOUNDSCHECK_ENV, "") not in ("", "0")


class OptionalBuildExt(build_ext):  # type: ignore[misc]
    """build_ext that never fails the install (the checked variant does fail: it is asked for
    by tests, which must know)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler, missing headers, ...
            if _checked():
                raise
            print(NOTICE.format(f"{type(e).__name__}: {e}"), file=sys.stderr)

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            if _checked():
                raise
            print(NOTICE.format(f"{type(e).__name__}: {e}"), file=sys.stderr)


def _extensions() -> list[Any]:
    if os.environ.get("STATEQUERY_NO_EXTENSIONS"):
        print(NOTICE.format("STATEQUERY_NO_EXTENSIONS is set"), file=sys.stderr)
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print(NOTICE.format("Cython is not installed"), file=sys.stderr)
        return []
    from setuptools import Extension

    checked = _checked()
    if checked:
        sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        cflags = ["-O1", "-g", "-fno-omit-frame-pointer", *sanitize]
        ldflags = sanitize
    else:
        cflags, ldflags = ["-O2"], []
    ext = Extension(
        "statequery.backends._read",
        ["statequery/backends/_read.pyx"],
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        optional=not checked,
    )
    # the SST reader's block walk (statequery/backends/sst.py), optional in the same way
    sst = Extension(
        "statequery.backends._sst",
        ["statequery/backends/_sst.pyx"],
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        optional=not checked,
    )
    # lookups' per-key-group index (statequery/backends/keyindex.py), optional in the same way
    keyindex = Extension(
        "statequery.backends._keyindex",
        ["statequery/backends/_keyindex.pyx"],
        extra_compile_args=cflags,
        extra_link_args=ldflags,
        optional=not checked,
    )
    directives = {"boundscheck": checked, "wraparound": checked}
    if checked:
        directives["initializedcheck"] = True
    try:
        return list(cythonize(
            [ext, sst, keyindex], language_level=3, quiet=True, compiler_directives=directives,
            # the checked variant's C sources never replace the normal ones
            build_dir=os.path.join("build", "boundscheck") if checked else None,
            force=checked,
        ))
    except Exception as e:
        print(NOTICE.format(f"Cython failed: {e}"), file=sys.stderr)
        return []


setup(
    ext_modules=_extensions(),
    cmdclass={"build_py": BuildPyWithCatalog, "build_ext": OptionalBuildExt},
)
