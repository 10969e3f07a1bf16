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

__all__ = [
    "TOKEN_ENV", "running_server", "server_token", "spark_dir", "state_file", "token_file",
    "write_token",
]

#: the environment variable the server's JVM reads its token from: Spark Connect checks it
#: (``spark.connect.authenticate.token``), so does the Thrift server's password check
#: (``statequery.serve.TokenAuthenticator``), and PySpark's Connect client sends it
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"


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


def token_file(folder: Path) -> Path:
    """The server's token: one line, mode 0600, owned by the server's user (in the metastore
    folder, next to ``server.json``, which holds no secret)."""
    return folder / "server.token"


def write_token(folder: Path) -> str:
    """A new random token in :func:`token_file` (created 0600, never through a link); returns it.
    A token file left by an earlier server is replaced."""
    import secrets

    token = secrets.token_urlsafe(32)
    path = token_file(folder)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def server_token(info: dict[str, Any]) -> str:
    """The token of the server ``info`` describes (``running_server``), read from its token file;
    :class:`~statequery.exceptions.ServerAccessError` when this user cannot read it."""
    from statequery.exceptions import ServerAccessError

    path = Path(str(info.get("token_file") or ""))
    if not info.get("token_file"):
        raise ServerAccessError(
            f"the server at {info.get('url')} (pid {info.get('pid')}) names no token file: it is "
            "from an older statequery; restart it (statequery serve --stop, then serve)"
        )
    try:
        token = path.read_text().strip()
    except OSError as e:
        raise ServerAccessError(
            f"{path}: cannot read the server's token ({e.strerror or e}): only the user who "
            "started statequery serve can connect to it"
        ) from None
    if not token:
        raise ServerAccessError(f"{path}: the server's token file is empty")
    return token


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
        token_file(folder).unlink(missing_ok=True)
        return None
    if not _accepts(str(info["host"]), int(info["port"])):
        return None  # alive but not (yet, or any more) listening
    return info
