"""Where the console script's Spark lives and whether a ``statequery serve`` runs there.

Kept apart from :mod:`statequery.spark` (which imports PySpark) so that a client of a running
server (``statequery sql --spark``, ``statequery shell``) starts without importing PySpark.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

__all__ = ["running_server", "spark_dir", "state_file"]


def spark_dir(explicit: str | None = None) -> Path:
    """The folder of the metastore and warehouse: ``--spark-dir``, ``$STATEQUERY_SPARK_DIR``,
    or ``$XDG_DATA_HOME/statequery/spark`` (``~/.local/share/statequery/spark``)."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    if os.environ.get("STATEQUERY_SPARK_DIR"):
        return Path(os.environ["STATEQUERY_SPARK_DIR"]).expanduser().resolve()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base, "statequery", "spark").resolve()


def state_file(folder: Path) -> Path:
    """Where a running server says where it listens (in the metastore folder)."""
    return folder / "server.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def running_server(folder: Path) -> dict[str, Any] | None:
    """The server of ``folder`` (what it wrote in ``server.json``) when it runs, else None.

    A file left by a server that died is removed.
    """
    path = state_file(folder)
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not _alive(int(info.get("pid", 0))):
        path.unlink(missing_ok=True)
        return None
    if not _accepts(str(info["host"]), int(info["port"])):
        return None  # alive but not (yet, or any more) listening
    return info
