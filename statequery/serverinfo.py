"""Where the console script's Spark lives and whether a ``statequery serve`` runs there.

Kept apart from :mod:`statequery.spark` (which imports PySpark) so that a client of a running
server (``statequery sql --spark``, ``statequery shell``) starts without importing PySpark; a floor
below both :mod:`statequery.spark` and :mod:`statequery.cli`, which use it.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

__all__ = [
    "TOKEN_ENV", "MetastoreBusy", "embedded_metastore", "folder_conf", "lock_file",
    "lock_metastore", "release_metastore", "running_server", "server_token", "spark_dir",
    "state_file", "token_file", "write_token",
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


def folder_conf(folder: Path) -> dict[str, str]:
    """The settings of ``folder/spark-defaults.conf`` (Spark's format: ``key value`` a line,
    ``#`` comments), which every Spark command of the folder and its ``spark-sql`` command line
    use: a metastore on a database server, its JDBC driver, a shared warehouse, ..."""
    path = folder / "spark-defaults.conf"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    conf: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            from statequery.exceptions import InvalidOptionError

            raise InvalidOptionError(f"{path}, line {number}: expected 'key value', got {line!r}")
        conf[parts[0]] = parts[1].strip()
    return conf


#: the connection URL setting of Spark's Hive metastore
CONNECTION_URL = "spark.hadoop.javax.jdo.option.ConnectionURL"


def embedded_metastore(folder: Path) -> bool:
    """Whether the metastore of ``folder`` is the embedded Derby database (one Spark at a time),
    not one on a database server that ``folder/spark-defaults.conf`` names."""
    return folder_conf(folder).get(CONNECTION_URL, "jdbc:derby:").startswith("jdbc:derby:")


def lock_file(folder: Path) -> Path:
    """The file whose lock a Spark command of ``folder`` holds from before its Spark starts
    until it ends (:func:`lock_metastore`)."""
    return folder / "metastore.lock"


class MetastoreBusy(Exception):
    """Another statequery command holds the metastore lock of the folder."""

    def __init__(self, folder: Path, holder: str) -> None:
        super().__init__(holder)
        self.folder = folder
        self.holder = holder


#: the lock this process holds (its file descriptor), kept open until the process ends
_held: dict[Path, int] = {}


def lock_metastore(folder: Path, command: str) -> int | None:
    """Take the lock of ``folder``'s embedded metastore for this process, before any Spark
    starts: ``flock`` on ``metastore.lock`` (atomic: of two commands started at once, one gets
    it), held until the process ends (or, passed on, until the process it was given to ends:
    ``statequery serve``'s server). Its file says who holds it (pid and command).

    Returns the lock's file descriptor, or None when the metastore is on a database server
    (several Sparks at once are fine there). Raises :class:`MetastoreBusy` naming the holder
    when another process has it.
    """
    import fcntl

    if not embedded_metastore(folder):
        return None
    if folder in _held:
        return _held[folder]
    folder.mkdir(parents=True, exist_ok=True)
    path = lock_file(folder)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        finally:
            os.close(fd)
        pid, _, what = text.partition(" ")
        holder = f"statequery {what} (pid {pid})" if pid.isdigit() and what else \
            "another statequery command"
        raise MetastoreBusy(folder, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
    _held[folder] = fd
    return fd


def release_metastore() -> None:
    """Give back the metastore locks this process holds (at the end of a Spark command; a
    server it was passed to keeps it)."""
    while _held:
        _, fd = _held.popitem()
        os.close(fd)
