"""The exception hierarchy of statequery.

Every error raised on purpose derives from :class:`StatequeryError`. Errors about bytes name the
file (or inline handle) and, where known, the byte offset, so a user can tell which of a
savepoint's hundreds of files is damaged.
"""

from __future__ import annotations


class StatequeryError(Exception):
    """Base class of every error statequery raises on purpose."""


class SavepointNotFoundError(StatequeryError):
    """The given location holds no ``_metadata`` (neither a savepoint nor a checkpoint)."""


class CorruptStateError(StatequeryError):
    """Bytes that do not follow Flink's format: truncated, wrong magic, impossible lengths.

    ``source`` names the file or inline handle, ``offset`` the byte position where reading failed.
    """

    def __init__(self, message: str, source: str | None = None, offset: int | None = None) -> None:
        self.reason = message
        self.source = source
        self.offset = offset
        where = ""
        if source is not None:
            where = f"{source}"
            if offset is not None:
                where += f" at byte {offset}"
            where += ": "
        super().__init__(f"{where}{message}")


class UnsupportedFormatError(StatequeryError):
    """A well-formed input using a version or feature statequery does not read.

    The message names the version or feature.
    """


class UnknownSerializerError(StatequeryError):
    """A serializer snapshot class statequery cannot decode; the affected state is not decodable."""

    def __init__(self, class_name: str, message: str | None = None) -> None:
        self.class_name = class_name
        super().__init__(message or f"unknown serializer snapshot class {class_name}")


class StorageError(StatequeryError):
    """A file referenced by the savepoint cannot be read.

    It is missing, unreadable, or escapes its directory.
    """


class RedirectRefusedError(StorageError):
    """A server answered a read of a savepoint's file with a redirect (3xx). statequery follows
    none (the target could lie outside the savepoint): the message names the file and the target.
    """


class NoSuchOperatorError(StatequeryError, KeyError):
    """No operator matches the given uid, name or id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class NoSuchStateError(StatequeryError, KeyError):
    """The operator has no state of that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NoSuchTableError(StatequeryError, KeyError):
    """The catalog database has no table of that name. ``detail``: the tables there are (with
    the closest one), for a caller that names the database instead."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail if detail is not None else message

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidOptionError(StatequeryError, ValueError):
    """An option given to a reader, the CLI or the Spark data source is unknown or malformed."""


class SnapshotIgnoredWarning(UserWarning):
    """A StateMeta snapshot was damaged or tampered with (its checksum does not match): it is
    ignored and the listing is derived from ``_metadata``."""


class RunIndexMismatchWarning(UserWarning):
    """A key group's bytes do not match its run index (a run that does not start with the
    recorded state id, ends elsewhere, or runs past the key group): the index is not used for that
    key group, which is walked whole instead (docs/statemeta.md, "Trust"). The message names the
    file and the key group."""


class MissingExtraError(StatequeryError):
    """An optional package a feature needs is not installed; the message names the extra
    (``pip install 'statequery[sql]'``)."""

    def __init__(self, feature: str, package: str, extra: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(
            f"{feature} needs the package {package!r}: pip install 'statequery[{extra}]'"
        )


class OutputError(StatequeryError):
    """The CLI cannot write the output it was asked for (``--out``): the message names the file."""


class InvalidKeyError(InvalidOptionError):
    """A key given by a user does not fit the key type: the message names the field and the type
    it expects, and what the given value was read as."""


def require_extra(module: str, extra: str, feature: str) -> None:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``extra``."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(feature, module, extra) from None


class SavepointChangedError(StatequeryError):
    """A table was set up over one savepoint, and the files at its location are now another."""


class QueryLimitError(StatequeryError):
    """A SQL query went past one of its limits (memory, rows or bytes of its result): the
    message names the limit and how to change it (docs/security.md, "Query limits")."""


class QueryTimeoutError(QueryLimitError):
    """A SQL query ran longer than its wall-clock timeout and was interrupted."""


class ServerAccessError(StatequeryError):
    """A client of ``statequery serve`` cannot authenticate: the server's token file (named in
    the message) cannot be read, which is the case for any user but the server's own."""
