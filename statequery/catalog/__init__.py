"""A folder of savepoints as a catalog: every savepoint (or checkpoint) directory is one database,
its tables ``state_meta``, one per state and the operator tables.

The package: :mod:`~statequery.catalog.folder` (:class:`Catalog`: databases found in the folder,
table names resolved against the metadata, :data:`DEFAULT_CATALOG`) and
:mod:`~statequery.catalog.views` (the Spark view statements).
"""

from __future__ import annotations

from statequery.catalog.folder import DEFAULT_CATALOG, Catalog
from statequery.discovery import find_metadata_dir
from statequery.metadata.statemeta import sql_identifier

__all__ = ["DEFAULT_CATALOG", "Catalog", "find_metadata_dir", "sql_identifier"]
