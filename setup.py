"""Build steps beyond pyproject.toml's metadata:

* ships the example catalog (``catalog/``) inside the package as ``statequery/_catalog`` when a
  wheel is built (editable installs find ``catalog/`` in the checkout instead,
  statequery.discovery.default_catalog);
* compiles the optional decode path (``statequery/backends/_read.pyx``) and the SST reader's
  block walk (``statequery/backends/_sst.pyx``). It is optional: without
  a C compiler (or Cython), or when compiling fails, the package installs with a one-line notice
  and uses the pure-Python path (identical tables, slower).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
NOTICE = "statequery: compiled decode path not built ({}); using the pure-Python path"


class BuildPyWithCatalog(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        source = os.path.join(ROOT, "catalog")
        if os.path.isdir(source) and not self.editable_mode:
            target = os.path.join(self.build_lib, "statequery", "_catalog")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(".*", "__pycache__"))


class OptionalBuildExt(build_ext):  # type: ignore[misc]
    """build_ext that never fails the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler, missing headers, ...
            print(NOTICE.format(f"{type(e).__name__}: {e}"), file=sys.stderr)

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
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

    ext = Extension(
        "statequery.backends._read",
        ["statequery/backends/_read.pyx"],
        extra_compile_args=["-O2"],
        optional=True,
    )
    # the SST reader's block walk (statequery/backends/sst.py), optional in the same way
    sst = Extension(
        "statequery.backends._sst",
        ["statequery/backends/_sst.pyx"],
        extra_compile_args=["-O2"],
        optional=True,
    )
    try:
        return list(cythonize([ext, sst], language_level=3, quiet=True))
    except Exception as e:
        print(NOTICE.format(f"Cython failed: {e}"), file=sys.stderr)
        return []


setup(
    ext_modules=_extensions(),
    cmdclass={"build_py": BuildPyWithCatalog, "build_ext": OptionalBuildExt},
)
