"""Finding savepoints: the ``_metadata`` of a location, the savepoint directories of a catalog
folder, and the default catalog. Used by :mod:`statequery.savepoint` and
:mod:`statequery.catalog` (neither imports the other for this).

The default catalog is, in order: the folder named by ``STATEQUERY_CATALOG``; the example
catalog shipped inside the package (``statequery/_catalog`` in a wheel); the ``catalog/`` folder
of a source checkout (editable installs).
"""

from __future__ import annotations

import os
import posixpath
import re

from statequery.exceptions import SavepointNotFoundError, StorageError
from statequery.io import FileIO, join_location, normalize_location

__all__ = [
    "METADATA_FILE",
    "default_catalog",
    "find_metadata",
    "find_metadata_dir",
    "require_default_catalog",
    "why_not_found",
]

METADATA_FILE = "_metadata"
CATALOG_ENV = "STATEQUERY_CATALOG"
_CHK = re.compile(r"^chk-(\d+)$")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: where the example catalog is installed with the package, and where it is in a checkout
SHIPPED_CATALOG = os.path.join(_PACKAGE_DIR, "_catalog")
CHECKOUT_CATALOG = os.path.normpath(os.path.join(_PACKAGE_DIR, os.pardir, "catalog"))


def default_catalog() -> str | None:
    """The default catalog folder (see the module docstring), None when there is none."""
    env = os.environ.get(CATALOG_ENV)
    if env:
        return os.path.normpath(env) if "://" not in env else env
    for candidate in (SHIPPED_CATALOG, CHECKOUT_CATALOG):
        if os.path.isdir(candidate):
            return candidate
    return None


def require_default_catalog() -> str:
    """:func:`default_catalog`, or a :class:`SavepointNotFoundError` saying how to name one."""
    found = default_catalog()
    if found is None:
        raise SavepointNotFoundError(
            "no default catalog: this installation ships no example catalog and "
            f"{CATALOG_ENV} is not set; set {CATALOG_ENV} to a folder of savepoints or pass "
            "a catalog path"
        )
    return found


def find_metadata_dir(io: FileIO, location: str, depth: int = 3) -> str | None:
    """The directory under ``location`` holding the ``_metadata`` a database stands for.

    Checkpoint folders resolve to their highest ``chk-N``. A folder holding several savepoint
    directories is ambiguous (their names are random, not ordered by time): that raises
    :class:`SavepointNotFoundError` listing them, so the user names one.
    """
    location = normalize_location(location)
    if io.new_input(join_location(location, METADATA_FILE)).exists():
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


def find_metadata(io: FileIO, location: str) -> str:
    """The ``_metadata`` file for a savepoint/checkpoint directory, the file itself, a job
    directory holding ``chk-N`` checkpoints (the highest N), a folder holding one savepoint
    directory, or the name of a database of the default catalog (when no such path exists)."""
    original = location
    location = normalize_location(location.rstrip("/") if len(location) > 1 else location)
    if posixpath.basename(location) == METADATA_FILE and io.new_input(location).exists():
        return location
    if io.is_dir(location):
        candidate = join_location(location, METADATA_FILE)
        if io.new_input(candidate).exists():
            return candidate
        try:
            entries = io.list_dir(location)
        except StorageError:
            entries = []
        chks = sorted(
            (int(m.group(1)), name) for name in entries if (m := _CHK.match(name)) is not None
        )
        for _, name in reversed(chks):
            candidate = join_location(location, f"{name}/{METADATA_FILE}")
            if io.new_input(candidate).exists():
                return candidate
        # a folder holding one savepoint directory (Flink's savepoint target directory, or a
        # catalog database)
        found = find_metadata_dir(io, location, depth=2)
        if found is not None:
            return join_location(found, METADATA_FILE)
    elif "/" not in original and os.sep not in original and "://" not in original:
        catalog = default_catalog()
        if catalog is not None:
            try:
                db = join_location(catalog, original)
            except StorageError:
                db = None
            if db is not None and io.is_dir(db):
                found = find_metadata_dir(io, db, depth=2)
                if found is not None:
                    return join_location(found, METADATA_FILE)
    raise SavepointNotFoundError(
        f"no savepoint or checkpoint at {location}: {why_not_found(io, location, original)}"
    )


def why_not_found(io: FileIO, location: str, original: str) -> str:
    """What ``location`` is instead of a savepoint: missing, empty, still being written (Flink
    writes ``_metadata`` last), a file, or a folder without one."""
    expected = (
        "expected a directory holding _metadata, the _metadata file, a job directory with "
        "chk-N checkpoints, a folder holding one savepoint directory, or a database of the "
        f"default catalog ({default_catalog() or 'none: set ' + CATALOG_ENV})"
    )
    try:
        is_dir = io.is_dir(location)
        entries = [e for e in io.list_dir(location) if not e.startswith(".")] if is_dir else []
    except StorageError:
        return expected
    if not is_dir:
        try:
            is_file = io.new_input(location).exists()
        except StorageError:
            is_file = False
        if is_file:
            return f"it is a file, not a {METADATA_FILE} file or a directory holding one"
        if "/" not in original and os.sep not in original and "://" not in original:
            return f"no such file or directory, nor database of the default catalog " \
                f"({default_catalog() or 'none: set ' + CATALOG_ENV})"
        return "no such file or directory"
    if not entries:
        return "the directory is empty"
    chks = sorted((int(m.group(1)), e) for e in entries if (m := _CHK.match(e)) is not None)
    if chks:
        names = ", ".join(e for _, e in chks[-3:])
        return (f"none of its checkpoints ({names}) holds a {METADATA_FILE} file: Flink writes "
                "it last, when a checkpoint completes (still running, or failed)")
    try:
        dirs = [e for e in entries if io.is_dir(join_location(location, e))]
    except StorageError:
        dirs = []
    files = [e for e in entries if e not in dirs]
    name = posixpath.basename(location.rstrip("/"))
    if files and _unfinished(name, files):
        return (f"the directory holds no {METADATA_FILE} file: Flink writes it last, so this "
                "savepoint or checkpoint is still being written, or was never completed")
    pending = [e for e in dirs if e.startswith("savepoint-")]
    if pending:
        return (f"{', '.join(pending[:3])} holds no {METADATA_FILE} file: Flink writes it last, "
                "so that savepoint is still being written, or was never completed")
    if name in _JOB_FOLDERS:
        parent = posixpath.dirname(location.rstrip("/")) or "/"
        return (f"it holds no savepoint: it is the {name}/ folder of a checkpointed job "
                f"({_count(len(entries), 'entry', 'entries')}, {_JOB_FOLDERS[name]}); "
                f"give the job directory {parent} or one of its chk-N checkpoints")
    return f"it holds no savepoint, only {_contents(io, location, dirs, files)}; {expected}"


#: the folders of a checkpointed job directory beside its chk-N checkpoints
_JOB_FOLDERS = {
    "shared": "the files its incremental checkpoints share",
    "taskowned": "the files its task managers own",
}
#: the names Flink gives a savepoint's or checkpoint's state files (UUIDs), or a savepoint or
#: checkpoint directory
_STATE_FILE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SNAPSHOT_DIR = re.compile(r"^(savepoint-[0-9a-f]{6}-[0-9a-f]{12}|chk-\d+)$")


def _unfinished(name: str, files: list[str]) -> bool:
    """Whether a folder without ``_metadata`` looks like a savepoint or checkpoint that Flink
    has not finished writing: named as Flink names them, or holding state files (UUID names)."""
    if name in _JOB_FOLDERS:
        return False
    return _SNAPSHOT_DIR.match(name) is not None or any(_STATE_FILE.match(f) for f in files)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _listed(names: list[str], suffix: str = "") -> str:
    shown = ", ".join(n + suffix for n in sorted(names)[:3])
    return shown + (", ..." if len(names) > 3 else "")


def _contents(io: FileIO, location: str, dirs: list[str], files: list[str]) -> str:
    """What a folder without a savepoint holds, in a few words: the incomplete checkpoints
    below it, a job's shared/ folder, other folders, files."""
    parts = []
    others = []
    for d in sorted(dirs):
        if d in _JOB_FOLDERS:
            parts.append(f"a {d}/ folder")
            continue
        try:
            below = [e for e in io.list_dir(join_location(location, d)) if _CHK.match(e)]
        except StorageError:
            below = []
        if below:
            chks = sorted(below, key=lambda e: int(e[4:]))[-3:]
            parts.append(f"checkpoints below it ({', '.join(f'{d}/{c}' for c in chks)}) "
                         f"with no {METADATA_FILE}")
        else:
            others.append(d)
    if others:
        parts.append(f"{_count(len(others), 'folder', 'folders')} ({_listed(others, '/')})")
    if files:
        parts.append(f"{_count(len(files), 'file', 'files')} ({_listed(files)})")
    return " and ".join(parts)
