"""Ships the example catalog (``catalog/``) inside the package as ``statequery/_catalog`` when a
wheel is built; metadata lives in pyproject.toml. Editable installs find ``catalog/`` in the
checkout instead (statequery.discovery.default_catalog)."""

from __future__ import annotations

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithCatalog(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        source = os.path.join(ROOT, "catalog")
        if os.path.isdir(source) and not self.editable_mode:
            target = os.path.join(self.build_lib, "statequery", "_catalog")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(".*", "__pycache__"))


setup(cmdclass={"build_py": BuildPyWithCatalog})
