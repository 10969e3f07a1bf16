"""Confinement: where a location may point and where a file read may resolve to.

Locations are local paths or URIs; :func:`normalize_location` gives each its one form (Flink's
``file:/x`` is the local path ``/x``; an http(s) path is percent-decoded once, its dot segments
removed, ``%2e%2e`` included, and encoded again, so what is checked is what is requested).
:func:`join_location` refuses a relative handle that escapes its savepoint directory,
:func:`is_under` and :func:`store_of` tell whether a location lies in a root or on a store.

:class:`Confinement` holds a :class:`~statequery.io.FileIO`'s allowed roots and the savepoint
trees it was asked to confine: a local file in one must *resolve* (``realpath``, then the
descriptor actually opened) into its bounds, a remote symbolic link must point inside them.
Redirects are refused (:func:`redirect_error`): their target could lie outside the savepoint.
"""

from __future__ import annotations

import os
import posixpath
import threading
from collections.abc import Mapping
from typing import IO
from urllib.parse import quote, unquote, urlsplit

from statequery.exceptions import RedirectRefusedError, StorageError

__all__ = [
    "LINKLESS",
    "OBJECT_STORES",
    "URL_SCHEMES",
    "Confinement",
    "filesystem_of",
    "is_local",
    "is_local_normalized",
    "is_under",
    "join_location",
    "location_parent",
    "normalize_location",
    "redirect_error",
    "refusal_in",
    "same_store",
    "store_of",
]

_LOCAL_SCHEMES = ("", "file", "local")
#: schemes whose paths are URL paths: percent-encoded, dot segments removed by servers and clients
URL_SCHEMES = ("http", "https")
#: what stays unescaped in a canonical URL path (RFC 3986 pchar and "/"; the rest is %XX)
_URL_PATH_SAFE = "/!$&'()*+,;=:@~"
#: object stores: one PUT is atomic, and there are no symbolic links
OBJECT_STORES = ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "oss")
#: schemes without symbolic links (nothing to resolve before a read)
LINKLESS = (*OBJECT_STORES, "s3n", "http", "https", "memory")


def normalize_location(location: str) -> str:
    """Normalise a path or URI; local paths become absolute.

    Flink's ``file:/x`` and ``file:///x`` become the local path ``/x``.
    """
    if not location:
        raise StorageError("empty location")
    if "\x00" in location:  # no file system names one; os.* would raise a bare ValueError
        raise StorageError(f"location {location!r} holds a NUL character")
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter, not a scheme
        return location
    if scheme in _LOCAL_SCHEMES:
        path = parts.path if scheme else location
        if scheme and parts.netloc and parts.netloc != "localhost":
            path = "//" + parts.netloc + path
        # relative paths are resolved against the working directory first: every later join
        # and parent lookup then works on an absolute path ("." and "_metadata" included)
        return os.path.abspath(path) if path else path
    if scheme in URL_SCHEMES:
        # the query is only made sendable (its %XX kept: decoding "%26" would split a value)
        query = quote(parts.query, safe="/?:@!$&'()*+,;=%~")
        return parts._replace(path=_canonical_url_path(parts.path, location),
                              query=query).geturl()
    return location


def _decoded_url_path(path: str, what: str) -> str:
    """A URL path percent-decoded once (NUL refused: no server or file names one)."""
    decoded = unquote(path)
    if "\x00" in decoded:
        raise StorageError(f"{what!r} holds an encoded NUL character")
    return decoded


def _encoded_url_path(decoded: str) -> str:
    return quote(decoded, safe=_URL_PATH_SAFE)


def _canonical_url_path(path: str, location: str) -> str:
    """The one form of an http(s) path that is both checked and requested.

    The path is percent-decoded once, its dot segments removed (``%2e%2e`` is ``..``), then
    encoded again; the HTTP client sends it as is (no second decoding or normalisation), so
    confinement and the request see the same path. Idempotent.
    """
    if not path:
        return path
    decoded = _decoded_url_path(path, location)
    normal = "/" + posixpath.normpath(decoded).lstrip("/")
    if decoded.endswith("/") and not normal.endswith("/"):
        normal += "/"
    return _encoded_url_path(normal)


def is_local(location: str) -> bool:
    """Whether ``location`` is a local path (or a ``file:`` URI)."""
    return is_local_normalized(normalize_location(location))


def is_local_normalized(location: str) -> bool:
    """:func:`is_local` of a location :func:`normalize_location` already returned."""
    scheme = urlsplit(location).scheme.lower()
    return scheme in _LOCAL_SCHEMES or len(scheme) == 1


def filesystem_of(location: str) -> str:
    """The filesystem a location lives on, as its scheme: ``file`` for local paths, ``s3`` for
    ``s3://``/``s3a://``/``s3n://`` ... (what must match for a handle to be trusted)."""
    location = normalize_location(location)
    if is_local_normalized(location):
        return "file"
    scheme = urlsplit(location).scheme.lower()
    return {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfss": "abfs"}.get(scheme, scheme)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def store_of(location: str) -> tuple[str, str, int | None]:
    """The store a location lives in: ``(filesystem, host or bucket, port)``.

    ``("file", "", None)`` for local paths, ``("s3", "bucket", None)`` for ``s3://bucket/k``,
    ``("http", "127.0.0.1", 8080)`` for ``http://127.0.0.1:8080/x`` (default ports filled in). Two
    locations are on the same store only if all three agree: what a state handle must share with
    its savepoint (the endpoint itself comes from the FileIO's storage options, the same for both).
    """
    location = normalize_location(location)
    fs = filesystem_of(location)
    if fs == "file":
        return fs, "", None
    parts = urlsplit(location)
    try:
        port = parts.port
    except ValueError as e:
        raise StorageError(f"invalid location {location!r}: {e}") from None
    host = (parts.hostname or "").lower()
    if not host and parts.path.strip("/"):  # memory:///bucket/x is memory://bucket/x
        host = parts.path.strip("/").split("/", 1)[0]
    return fs, host, port if port is not None else _DEFAULT_PORTS.get(fs)


def same_store(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are on the same store (:func:`store_of`)."""
    return store_of(a) == store_of(b)


def is_under(location: str, root: str) -> bool:
    """Whether ``location`` is ``root`` or inside it (same filesystem, bucket and path prefix)."""
    location, root = normalize_location(location), normalize_location(root)
    if filesystem_of(location) != filesystem_of(root):
        return False
    if is_local_normalized(location):
        loc = os.path.normpath(os.path.abspath(location))
        base = os.path.normpath(os.path.abspath(root))
        return loc == base or loc.startswith(base.rstrip(os.sep) + os.sep)
    if store_of(location) != store_of(root):
        return False
    path, base = _store_path(location), _store_path(root)
    return path == base or path.startswith(base.rstrip("/") + "/")


def _store_path(location: str) -> str:
    """The path of a remote location inside its store (bucket or host excluded)."""
    parts = urlsplit(location)
    path = parts.path or "/"
    if not parts.hostname and path.strip("/"):  # memory:///bucket/x: the bucket is in the path
        path = "/" + path.strip("/").split("/", 1)[1] if "/" in path.strip("/") else "/"
    return posixpath.normpath(path)


def location_parent(location: str) -> str:
    """The directory that holds ``location``."""
    location = normalize_location(location)
    if is_local_normalized(location):
        return os.path.dirname(location.rstrip("/")) or "/"
    parts = urlsplit(location)
    return parts._replace(path=posixpath.dirname(parts.path.rstrip("/"))).geturl()


def join_location(base: str, relative: str) -> str:
    """Resolve ``relative`` against the directory ``base``.

    Raises :class:`StorageError` when the result would escape ``base`` (a relative state handle
    must stay inside its savepoint directory).
    """
    if not relative or relative.startswith("/") or "\x00" in relative or urlsplit(relative).scheme:
        raise StorageError(f"not a relative path: {relative!r}")
    base = normalize_location(base)
    if is_local_normalized(base):
        joined = os.path.normpath(os.path.join(base, relative))
        root = os.path.normpath(base)
        if joined != root and not joined.startswith(root.rstrip(os.sep) + os.sep):
            raise StorageError(f"relative path {relative!r} escapes {base}")
        return joined
    parts = urlsplit(base)
    root = parts.path.rstrip("/")
    if parts.scheme.lower() in URL_SCHEMES:
        # a URL path: decoded once, here, before the check (``%2e%2e`` is ``..``); the joined
        # path is requested exactly as checked (normalize_location keeps it as it is)
        root = _decoded_url_path(root, base)
        decoded = _decoded_url_path(relative, relative)
        joined_path = posixpath.normpath(posixpath.join(root or "/", decoded))
        if not joined_path.startswith(root + "/"):
            raise StorageError(f"relative path {relative!r} escapes {base} (percent-decoded: "
                               f"{decoded!r})")
        return parts._replace(path=_encoded_url_path(joined_path)).geturl()
    joined_path = posixpath.normpath(posixpath.join(root or "/", relative))
    if not joined_path.startswith(root + "/"):
        raise StorageError(f"relative path {relative!r} escapes {base}")
    return parts._replace(path=joined_path).geturl()


def refusal_in(e: BaseException) -> RedirectRefusedError | None:
    """A redirect refusal raised inside a client library and wrapped by it (fsspec turns every
    failed HTTP ``info`` into ``FileNotFoundError``), or None."""
    chain: BaseException | None = e
    seen: set[int] = set()
    while chain is not None and id(chain) not in seen:
        if isinstance(chain, RedirectRefusedError):
            return chain
        seen.add(id(chain))
        chain = chain.__cause__ or chain.__context__
    return None


def redirect_error(url: str, status: int, target: str | None) -> RedirectRefusedError:
    """The refusal of one redirect: names the file and where the server pointed (a header, shown
    shortened and escaped; nothing of a response body)."""
    where = "no Location" if not target else repr(target[:300] + ("..." if len(target) > 300
                                                                   else ""))
    return RedirectRefusedError(
        f"{url}: the server answered {status} (a redirect to {where}); statequery follows no "
        "redirect for a savepoint's files (its target could lie outside the savepoint: another "
        "host, port or path) and refuses to read it; give the location the files are served at"
    )


class Confinement:
    """Where the files one :class:`~statequery.io.FileIO` reads may resolve to.

    ``allowed_roots`` (normalised locations) limit where absolute state handles may point
    (docs/security.md); :meth:`confine` adds a savepoint's own tree. A location inside one of
    them must resolve into its bounds: local files are checked before they are opened
    (:meth:`check_resolved`) and after (:meth:`check_descriptor`), remote symbolic links by
    their target (:meth:`check_link`).
    """

    def __init__(self, allowed_roots: tuple[str, ...]) -> None:
        self.allowed_roots = allowed_roots
        #: savepoint trees registered by :meth:`confine`: what lies in one must resolve into it
        self.confined_roots: tuple[str, ...] = ()
        self._real_roots: dict[str, str] = {}
        self._lock = threading.Lock()

    def confine(self, root: str) -> None:
        """Register a savepoint's own tree (see :meth:`FileIO.confine`)."""
        root = normalize_location(root)
        with self._lock:
            if root not in self.confined_roots:
                self.confined_roots = (*self.confined_roots, root)

    def bounds(self, location: str) -> tuple[str, ...] | None:
        """Where ``location`` may resolve to: None when it lies in no confined or allowed root
        (an absolute path the user named), else the roots it may resolve into."""
        inside = [r for r in (*self.confined_roots, *self.allowed_roots) if is_under(location, r)]
        if not inside:
            return None
        return tuple(dict.fromkeys((*inside, *self.allowed_roots)))

    def link_bounds(self, location: str) -> tuple[str, ...] | None:
        """:meth:`bounds` of a remote location whose filesystem has symbolic links; None for
        object stores and HTTP (no links) and for locations in no root."""
        if urlsplit(location).scheme.lower() in LINKLESS:
            return None
        return self.bounds(location)

    def _real_root(self, root: str) -> str:
        real = self._real_roots.get(root)
        if real is None:
            real = self._real_roots[root] = os.path.realpath(root)
        return real

    def _inside_real(self, real: str, bounds: tuple[str, ...]) -> bool:
        for root in bounds:
            if not is_local_normalized(root):
                continue
            base = self._real_root(root)
            if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
                return True
        return False

    def _escape(self, location: str, target: str, bounds: tuple[str, ...]) -> StorageError:
        return StorageError(
            f"{location} resolves to {target}, outside {' or '.join(bounds)} (a symbolic link "
            "out of the savepoint or allowed root); statequery refuses to read it"
        )

    def check_resolved(self, location: str) -> None:
        """Before a local file is opened or stat'ed: its resolved path stays in its bounds."""
        bounds = self.bounds(location)
        if bounds is None:
            return
        try:
            real = os.path.realpath(location)
            inside = self._inside_real(real, bounds)
        except (OSError, ValueError) as e:  # a link swapped for a file while it was resolved
            raise StorageError(f"cannot check where {location} resolves to (did a symbolic "
                               f"link change while it was read?): {e}") from e
        if not inside:
            raise self._escape(location, real, bounds)

    def check_descriptor(self, location: str, raw: IO[bytes]) -> None:
        """After a local file is opened: the file actually opened is inside the bounds (a link
        swapped in between the check and the open is caught here)."""
        bounds = self.bounds(location)
        if bounds is None:
            return
        try:
            fd = raw.fileno()
            proc = f"/proc/self/fd/{fd}"
            if os.path.islink(proc):
                real = os.readlink(proc)
            else:  # no /proc: the resolved name must still be the file that was opened
                real = os.path.realpath(location)
                st, fst = os.stat(real), os.fstat(fd)
                if (st.st_dev, st.st_ino) != (fst.st_dev, fst.st_ino):
                    real = "<a file swapped in while it was opened>"
        except (OSError, ValueError) as e:
            raise StorageError(f"cannot check where {location} resolves to: {e}") from e
        if not self._inside_real(real, bounds):
            raise self._escape(location, real, bounds)

    def check_link(self, location: str, info: Mapping[str, object],
                   bounds: tuple[str, ...]) -> None:
        """Remote filesystems with symbolic links (HDFS, SFTP ...): ``location`` (its
        filesystem's ``info``) is no link, or a link pointing inside ``bounds``."""
        if not (info.get("islink") or info.get("type") in ("link", "symlink")):
            return
        dest = info.get("destination") or info.get("symlink_target") or info.get("target")
        if not dest:
            raise self._escape(location, "an unknown link target", bounds)
        dest = str(dest)
        if not urlsplit(dest).scheme:  # a path on the same filesystem, maybe relative
            parts = urlsplit(location)
            base = posixpath.dirname(parts.path)
            dest = parts._replace(path=posixpath.normpath(posixpath.join(base, dest))).geturl()
        if not any(is_under(dest, r) for r in bounds):
            raise self._escape(location, dest, bounds)
