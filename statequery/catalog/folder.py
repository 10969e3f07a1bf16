"""A folder of savepoints as a catalog (:class:`Catalog`): every savepoint (or checkpoint) directory
is one database.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from statequery.discovery import (
    METADATA_FILE,
    default_catalog,
    find_metadata_dir,
    require_default_catalog,
    why_not_found,
)
from statequery.exceptions import NoSuchTableError, SavepointNotFoundError
from statequery.io import FileIO, join_location
from statequery.metadata.statemeta import sql_identifier

if TYPE_CHECKING:
    from statequery.savepoint import Savepoint

__all__ = ["DEFAULT_CATALOG", "Catalog"]

#: the default catalog when this module was imported ("" when there is none; see
#: :func:`statequery.discovery.default_catalog`)
DEFAULT_CATALOG = default_catalog() or ""


@dataclass
class Catalog:
    """The savepoints below ``root``, one database each, opened lazily and cached.

    ``classpath``, ``protobuf_descriptors`` and ``protobuf_messages`` are those of
    :meth:`Savepoint.open <statequery.savepoint.Savepoint.open>`, given to every database it
    opens (after the ``job.jar`` a database folder holds, :meth:`job_jar`)."""

    root: str = ""  # empty or None: the default catalog (statequery.discovery)
    io: FileIO = field(default_factory=FileIO)
    _open: dict[str, Savepoint] = field(default_factory=dict, repr=False)
    classpath: Sequence[str] | str | None = field(default=None, kw_only=True)
    protobuf_descriptors: str | os.PathLike[str] | None = field(default=None, kw_only=True)
    protobuf_messages: Mapping[str, str] | Sequence[str] | str | None = field(
        default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not self.root:
            self.root = require_default_catalog()

    def _children(self) -> list[str]:
        """The entries of the catalog folder; a missing folder is a one-line error naming it."""
        if not self.io.is_dir(self.root):
            what = ("is a file, not a folder" if self.io.new_input(self.root).exists()
                    else "does not exist")
            raise SavepointNotFoundError(f"catalog {self.root} {what}")
        return self.io.list_dir(self.root)

    def _is_a_database(self) -> bool:
        """Whether the catalog folder is itself one savepoint/checkpoint (a database), a common
        mix-up: ``--catalog catalog/user_activity`` for ``--catalog catalog``."""
        children = self._children()
        return METADATA_FILE in children or any(
            c.startswith(("savepoint-", "chk-")) for c in children
        )

    def databases(self) -> list[str]:
        names = []
        for child in self._children():
            if child.startswith(".") or not self.io.is_dir(join_location(self.root, child)):
                continue
            if find_metadata_dir(self.io, join_location(self.root, child)) is not None:
                names.append(child)
        return names

    def location(self, database: str) -> str:
        """The directory holding the database's ``_metadata``."""
        pending = None
        for child in self._children():
            if child == database or sql_identifier(child) == sql_identifier(database):
                found = find_metadata_dir(self.io, join_location(self.root, child))
                if found is not None:
                    return found
                pending = join_location(self.root, child)
        if pending is not None:  # the folder is there, without a savepoint (yet)
            raise SavepointNotFoundError(
                f"database {database!r} of catalog {self.root}: no savepoint or checkpoint at "
                f"{pending}: {why_not_found(self.io, pending, pending)}"
            )
        hint = ""
        if self._is_a_database():
            hint = (f"; {self.root} is itself one savepoint or checkpoint (a database): "
                    "name the folder that holds it as the catalog")
        raise SavepointNotFoundError(
            f"no savepoint database {database!r} in catalog {self.root} "
            f"(databases: {', '.join(self.databases()) or 'none'}){hint}"
        )

    def folder(self, database: str) -> str:
        """The database's folder in the catalog (a job's checkpoint directory: every version of
        it, :func:`statequery.open_job`); :meth:`location` is the one version it reads."""
        for child in self._children():
            if child == database or sql_identifier(child) == sql_identifier(database):
                return join_location(self.root, child)
        self.location(database)  # raises, naming the databases there are
        raise SavepointNotFoundError(f"no database {database!r} in catalog {self.root}")

    def savepoint(self, database: str) -> Savepoint:
        if database not in self._open:
            from statequery.arrow.kryo import classpath_of
            from statequery.savepoint import Savepoint

            self._open[database] = Savepoint.open(
                self.location(database), io=self.io,
                classpath=[*(self.job_jar(database) or ()), *classpath_of(self.classpath)],
                protobuf_descriptors=self.protobuf_descriptors or self.job_descriptors(database),
                protobuf_messages=self.protobuf_messages,
            )
        return self._open[database]

    def job_jar(self, database: str) -> list[str] | None:
        """The job's jar a (local) database folder holds beside its savepoint, ``job.jar``: its
        Kryo values are decoded with its classes (docs/decoding.md). None when there is none."""
        found = self._beside(database, "job.jar")
        return [found] if found else None

    def job_descriptors(self, database: str) -> str | None:
        """The Protobuf descriptor set a (local) database folder holds beside its savepoint,
        ``descriptors.pb`` (its ``protobuf_descriptors``). None when there is none."""
        return self._beside(database, "descriptors.pb")

    def _beside(self, database: str, name: str) -> str | None:
        if "://" in self.root:
            return None
        for child in self._children():
            if child == database or sql_identifier(child) == sql_identifier(database):
                path = os.path.join(self.root, child, name)
                return os.path.abspath(path) if os.path.isfile(path) else None
        return None

    def tables(self, database: str) -> list[str]:
        """``state_meta``, one table per state, then the operator tables
        (:mod:`statequery.optable`)."""
        sp = self.savepoint(database)
        meta = sp.state_meta()
        return ["state_meta", *meta.column("table_name").to_pylist(), *sp.operator_tables()]

    def resolve(self, database: str, table: str) -> dict[str, Any]:
        """The ``state_meta`` row of a table (operator and state); the name is resolved by
        :meth:`Savepoint.table` (the one table resolution of every front end)."""
        sp = self.savepoint(database)
        try:
            info = sp.table(table)
        except NoSuchTableError as e:
            detail = e.detail
            raise NoSuchTableError(
                f"no table {table!r} in database {database!r} ({detail})"
            ) from None
        for row in sp.state_meta().to_pylist():
            if row["table_name"] == info.table_name:
                return row  # type: ignore[no-any-return]
        raise NoSuchTableError(f"no table {table!r} in database {database!r}")
