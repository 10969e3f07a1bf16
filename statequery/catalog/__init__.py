"""A folder of savepoints as a catalog: every savepoint (or checkpoint) directory is one database.

A database's tables are ``state_meta`` plus one table per state, named by the ``table_name``
column of ``state_meta``. As in Flink's ``StateCatalog``, a table name is resolved by matching it
against the candidate names built from the metadata (never by splitting on ``_``).

The folder may be local or any fsspec URI. A database is found as:

* ``<root>/<db>/_metadata`` (a savepoint directory, or a checkpoint ``chk-N`` directory),
* ``<root>/<db>/<savepoint-xxxx>/_metadata`` (a savepoint target directory holding one savepoint),
* ``<root>/<db>/<job-id>/chk-N/_metadata`` or ``<root>/<db>/chk-N/_metadata`` (retained
  checkpoints; the highest N wins).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statequery.exceptions import NoSuchTableError, SavepointNotFoundError
from statequery.io import FileIO, join_location, normalize_location

if TYPE_CHECKING:
    from statequery.savepoint import Savepoint

__all__ = ["DEFAULT_CATALOG", "Catalog", "find_metadata_dir", "sql_identifier"]

#: the catalog shipped in the repository (``catalog/`` at the project root), when present
DEFAULT_CATALOG = os.path.normpath(
    os.environ.get(
        "STATEQUERY_CATALOG",
        os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "catalog"),
    )
)

_CHK = re.compile(r"^chk-(\d+)$")


def sql_identifier(text: str) -> str:
    """A lower-case SQL-safe identifier: runs of other characters become one ``_``."""
    ident = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()
    if not ident:
        ident = "_"
    if ident[0].isdigit():
        ident = "_" + ident
    return ident


def find_metadata_dir(io: FileIO, location: str, depth: int = 3) -> str | None:
    """The directory under ``location`` holding the ``_metadata`` a database stands for.

    Checkpoint folders resolve to their highest ``chk-N``. A folder holding several savepoint
    directories is ambiguous (their names are random, not ordered by time): that raises
    :class:`SavepointNotFoundError` listing them, so the user names one.
    """
    location = normalize_location(location)
    if io.new_input(join_location(location, "_metadata")).exists():
        return location
    if depth == 0 or not io.is_dir(location):
        return None
    children = [c for c in io.list_dir(location) if not c.startswith(".")]
    chks = sorted(((int(m.group(1)), c) for c in children if (m := _CHK.match(c))), reverse=True)
    for _, child in chks:
        found = find_metadata_dir(io, join_location(location, child), 0)
        if found is not None:
            return found
    found_dirs: list[str] = []
    for child in sorted(children):
        if _CHK.match(child) or child in ("shared", "taskowned"):
            continue
        child_loc = join_location(location, child)
        if io.is_dir(child_loc):
            found = find_metadata_dir(io, child_loc, depth - 1)
            if found is not None:
                found_dirs.append(found)
    if len(found_dirs) > 1:
        raise SavepointNotFoundError(
            f"{location} holds several savepoints or checkpoints; name one of: "
            + ", ".join(found_dirs)
        )
    return found_dirs[0] if found_dirs else None


@dataclass
class Catalog:
    """The savepoints below ``root``, one database each, opened lazily and cached."""

    root: str = DEFAULT_CATALOG
    io: FileIO = field(default_factory=FileIO)
    _open: dict[str, Savepoint] = field(default_factory=dict, repr=False)

    def databases(self) -> list[str]:
        names = []
        for child in self.io.list_dir(self.root):
            if child.startswith(".") or not self.io.is_dir(join_location(self.root, child)):
                continue
            if find_metadata_dir(self.io, join_location(self.root, child)) is not None:
                names.append(child)
        return names

    def location(self, database: str) -> str:
        """The directory holding the database's ``_metadata``."""
        for child in self.io.list_dir(self.root):
            if child == database or sql_identifier(child) == sql_identifier(database):
                found = find_metadata_dir(self.io, join_location(self.root, child))
                if found is not None:
                    return found
        raise SavepointNotFoundError(
            f"no savepoint database {database!r} in catalog {self.root} "
            f"(databases: {', '.join(self.databases()) or 'none'})"
        )

    def savepoint(self, database: str) -> Savepoint:
        if database not in self._open:
            from statequery.savepoint import Savepoint

            self._open[database] = Savepoint.open(self.location(database), io=self.io)
        return self._open[database]

    def tables(self, database: str) -> list[str]:
        meta = self.savepoint(database).state_meta()
        return ["state_meta", *meta.column("table_name").to_pylist()]

    def resolve(self, database: str, table: str) -> dict[str, Any]:
        """The ``state_meta`` row of a table (operator and state), matched on candidate names."""
        meta = self.savepoint(database).state_meta().to_pylist()
        wanted = table.lower()
        for row in meta:
            if row["table_name"].lower() == wanted:
                return row  # type: ignore[no-any-return]
        for row in meta:  # other spellings a user may type: uid/name/id with the state name
            for op in (row.get("operator_uid"), row.get("operator_name"), row.get("operator_id")):
                if op and sql_identifier(f"{op}__{row['state_name']}") == sql_identifier(table):
                    return row  # type: ignore[no-any-return]
        raise NoSuchTableError(
            f"no table {table!r} in database {database!r} "
            f"(tables: {', '.join(self.tables(database))})"
        )
