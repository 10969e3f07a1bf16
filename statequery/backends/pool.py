"""The restored RocksDB databases one savepoint keeps open (:class:`OpenDatabases`): the pool a
:class:`~statequery.scan.ReadContext` carries and :mod:`statequery.backends.rocksdb` uses."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["OpenDatabases"]


class OpenDatabases:
    """Restored RocksDB databases kept open for one :class:`~statequery.Savepoint` (at most
    ``limit``, least recently used closed first), so a warm lookup costs a seek, not a restore.
    A database evicted while a scan of another thread uses it (taken with ``use=True``) is
    closed when that scan releases it (:meth:`release`). :meth:`close` (``Savepoint.close()`` /
    leaving its ``with`` block) closes them all."""

    def __init__(self, limit: int = 4) -> None:
        self.limit = max(1, int(limit))
        self._dbs: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self._users: dict[int, int] = {}  # id(db) -> scans using it
        self._retired: dict[int, Any] = {}  # evicted while in use: closed by the last release
        self.restores = 0

    def get(self, key: Hashable, opener: Callable[[], Any], use: bool = False) -> Any:
        with self._lock:
            db = self._dbs.pop(key, None)
            if db is not None and db.is_open:
                self._dbs[key] = db  # most recently used last
            else:
                db = opener()
                self.restores += 1
                self._dbs[key] = db
            if use:
                self._users[id(db)] = self._users.get(id(db), 0) + 1
            self._evict()
            return db

    def peek(self, key: Hashable, use: bool = False) -> Any:
        """The open database kept under ``key`` (marked most recently used), or None."""
        with self._lock:
            db = self._dbs.get(key)
            if db is None or not db.is_open:
                return None
            self._dbs[key] = self._dbs.pop(key)
            if use:
                self._users[id(db)] = self._users.get(id(db), 0) + 1
            return db

    def release(self, db: object) -> None:
        """End one use of ``db`` (taken with ``use=True``)."""
        with self._lock:
            n = self._users.get(id(db), 0) - 1
            if n > 0:
                self._users[id(db)] = n
                return
            self._users.pop(id(db), None)
            retired = self._retired.pop(id(db), None)
        if retired is not None:
            retired.close()

    def _evict(self) -> None:
        while len(self._dbs) > self.limit:
            old = self._dbs.pop(next(iter(self._dbs)))
            if self._users.get(id(old)):
                self._retired[id(old)] = old
            else:
                old.close()

    def __len__(self) -> int:
        return len(self._dbs)

    def close(self) -> None:
        with self._lock:
            dbs = [*self._dbs.values(), *self._retired.values()]
            self._dbs, self._retired, self._users = {}, {}, {}
        for db in dbs:
            db.close()
