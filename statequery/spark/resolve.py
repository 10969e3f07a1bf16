"""The savepoint a read's options name: opened once per process (cached by location and
expected fingerprint), resolved to its exact ``_metadata`` location and fingerprint, which every
worker checks."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from statequery.exceptions import SavepointChangedError
from statequery.spark.options import ReadOptions

if TYPE_CHECKING:
    from statequery.optable import OperatorTable
    from statequery.savepoint import Savepoint


_OPEN: dict[tuple[str | int | None, ...], Savepoint] = {}


def _base(opts: ReadOptions) -> str:
    """The job the options name: ``path``, or the catalog database's folder."""
    if opts.path is not None:
        return opts.path
    from statequery.catalog import Catalog

    assert opts.catalog is not None and opts.database is not None
    return Catalog(opts.catalog).folder(opts.database)


def _user_types(opts: ReadOptions) -> dict[str, Any]:
    """The options ``classpath`` and ``protobuf_descriptors`` as ``statequery.open``'s (and
    ``open_job``'s) keyword arguments."""
    return {"classpath": opts.classpath, "protobuf_descriptors": opts.protobuf_descriptors}


def _open(opts: ReadOptions, fresh: bool = False) -> tuple[Savepoint, str | None, str | None]:
    """The savepoint and the (operator, state) the options name.

    Savepoints are cached per process by location and expected fingerprint; ``fresh`` opens the
    location again (planning does, so a query sees the files as they are now, and a checkpoint
    folder its newest ``chk-N``). Readers get options resolved by :func:`_resolve`: an exact
    ``_metadata`` location and its fingerprint, which every worker checks.
    """
    import statequery
    from statequery.catalog import Catalog

    operator, state = opts.operator, opts.state
    cache_key = (opts.path, opts.catalog, opts.database, opts.fingerprint, opts.classpath,
                 opts.protobuf_descriptors, opts.version)
    if fresh or cache_key not in _OPEN:
        _OPEN.pop(cache_key, None)
        if opts.version is not None:  # one version of a job (statequery.history)
            job = statequery.open_job(_base(opts), **_user_types(opts))
            sp = statequery.open(job.location_of(opts.version), **_user_types(opts))
        elif opts.path is not None:
            sp = statequery.open(opts.path, **_user_types(opts))
        elif opts.classpath or opts.protobuf_descriptors:
            assert opts.catalog is not None and opts.database is not None
            sp = statequery.open(Catalog(opts.catalog).location(opts.database),
                                 **_user_types(opts))
        else:
            assert opts.catalog is not None and opts.database is not None
            sp = Catalog(opts.catalog).savepoint(opts.database)
        _check_fingerprint(sp, opts.fingerprint)
        _OPEN[cache_key] = sp
    sp = _OPEN[cache_key]
    if opts.table is not None and not opts.is_state_meta:
        row = _resolve_table(sp, opts.table)
        operator, state = row["operator_id"], row["state_name"]
    return sp, operator, state


def _check_fingerprint(sp: Savepoint, expected: str | None) -> None:
    if expected is not None and sp.fingerprint != expected:
        raise SavepointChangedError(
            f"{sp.metadata_location} is not the savepoint this table was set up over: its "
            f"_metadata has SHA-256 {sp.fingerprint}, the table expects {expected}. "
            "Re-attach it (statequery attach --replace) or drop the table"
        )


def _resolve_table(sp: Savepoint, table: str) -> dict[str, str | None]:
    operator_id = sp.operator_table_id(table)
    if operator_id is not None:
        return {"operator_id": operator_id, "state_name": None}
    info = sp.table(table)  # the one table resolution (statequery.savepoint)
    return {"operator_id": info.operator_id, "state_name": info.name}


def _operator_table(opts: ReadOptions) -> OperatorTable | None:
    """The :class:`~statequery.optable.OperatorTable` the options name, or None (a state)."""
    sp, operator, state = _open(opts)
    if opts.is_state_meta or state is not None:
        return None
    assert operator is not None
    return sp.operator_table(operator, opts.state_names)


def _within(folder: str, location: str | None) -> bool:
    """Whether ``location`` is ``folder`` or inside it (locations as :func:`_resolve` makes)."""
    import os

    from statequery.io import normalize_location

    if location is None:
        return False
    base = normalize_location(folder).rstrip("/")
    if base.endswith("/_metadata"):
        base = base[: -len("/_metadata")]
    if "://" not in base:
        base = os.path.abspath(base)
    return location == base or location.startswith(base + "/")


def _resolve(opts: ReadOptions) -> ReadOptions:
    """``opts`` naming the savepoint as it is now: its exact location and fingerprint.

    The savepoint is opened once, and cached under the resolved options too, so the planning
    that follows does not open it again.
    """
    if opts.changes:
        return _resolve_changes(opts)
    sp, _, _ = _open(opts, fresh=True)
    resolved = replace(opts, path=sp.location, catalog=None, database=None,
                       fingerprint=sp.fingerprint, version=None)
    _OPEN[(resolved.path, None, None, resolved.fingerprint, resolved.classpath,
           resolved.protobuf_descriptors, None)] = sp
    return resolved


def _resolve_changes(opts: ReadOptions) -> ReadOptions:
    """A change feed's options naming the job's location, and the operator and state of its
    ``table`` (resolved in the newest complete version)."""
    import statequery

    location = _base(opts)
    with statequery.open_job(location, **_user_types(opts)) as job:
        operator, state = opts.operator, opts.state
        if opts.table is not None:
            row = _resolve_table(job.version(), opts.table)
            operator, state = row["operator_id"], row["state_name"]
        elif operator is not None:
            info = job.version().operator(operator)
            operator = info.operator_id
            if state is not None:
                state = job.version().state(operator, state).name
    return replace(opts, path=job.locations[0], catalog=None, database=None, table=None,
                   operator=operator, state=state)
