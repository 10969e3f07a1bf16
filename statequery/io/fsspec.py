"""Every scheme but local paths: fsspec (``s3``, ``hdfs``, ``gs``, ``abfs``, ``http``, ``memory``
...). The only module of statequery that imports fsspec.

http(s) clients follow no redirect (a 3xx answer is :class:`RedirectRefusedError` before its
body is read) and send URLs as :func:`~statequery.io.normalize_location` made them. A client
library that cannot start is reported with what it misses (:func:`environment_hint`), a missing
one with its extra (:data:`FS_PACKAGES`); :func:`construct` releases a half-built instance at
once, its finalizer silenced.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, TypeVar

from statequery.exceptions import RedirectRefusedError
from statequery.io.confine import OBJECT_STORES, URL_SCHEMES, redirect_error, refusal_in

if TYPE_CHECKING:
    from types import SimpleNamespace

    from aiohttp import ClientResponse, ClientSession, TraceRequestRedirectParams

__all__ = ["FS_PACKAGES", "FsspecFileSystem", "construct", "environment_hint"]

T = TypeVar("T")
Options = TypeVar("Options")

#: fsspec implementations that are separate packages: (package, statequery extra)
FS_PACKAGES = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
    "az": ("adlfs", "azure"),
}

def environment_hint(scheme: str, e: BaseException) -> str:
    """What a client library that failed to start is missing, when it can be told."""
    text = str(e)
    if scheme in ("hdfs", "viewfs") or "libjvm" in text or "libhdfs" in text:
        import shutil

        java = shutil.which("java")
        home = os.path.dirname(os.path.dirname(os.path.realpath(java))) if java else None
        jvm = ("a Java runtime was not found (install a JDK)" if not home
               else f"set JAVA_HOME to the Java runtime (e.g. JAVA_HOME={home})")
        return (f" (hdfs:// is read through pyarrow's libhdfs, which needs a JVM and Hadoop: "
                f"{jvm}, and HADOOP_HOME or ARROW_LIBHDFS_DIR to Hadoop's native libhdfs; "
                "CLASSPATH must hold Hadoop's jars)")
    return ""


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence native libraries that print to file descriptor 2 while they start (pyarrow's
    libhdfs loader prints a line per place it looked for libjvm): the error they raise says it."""
    try:
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no descriptor 2: nothing to silence
        yield
        return
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


async def _refuse_redirect(response: ClientResponse) -> None:
    """aiohttp's ``raise_for_status`` hook: every 3xx answer (redirects are not followed, see
    :class:`FsspecFileSystem`) is refused before its body is read."""
    if 300 <= int(response.status) < 400:
        raise redirect_error(str(response.url), int(response.status),
                             response.headers.get("Location"))


async def _on_redirect(session: ClientSession, context: SimpleNamespace,
                       params: TraceRequestRedirectParams) -> None:
    """aiohttp's redirect trace: a request that asked to follow redirects anyway is stopped
    before the next request is sent."""
    response = params.response
    raise redirect_error(str(params.url), int(response.status), response.headers.get("Location"))


async def _http_client(**kwargs: Any) -> ClientSession:
    """fsspec's ``get_client`` for http(s): an aiohttp session that refuses every redirect."""
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_request_redirect.append(_on_redirect)
    kwargs["raise_for_status"] = _refuse_redirect
    kwargs["trace_configs"] = [*kwargs.get("trace_configs", ()), trace]
    return aiohttp.ClientSession(**kwargs)


_hook_lock = threading.Lock()
_hook_users = 0
_saved_hook: Callable[[sys.UnraisableHookArgs], object] | None = None


def _quiet_fsspec_finalizer(unraisable: sys.UnraisableHookArgs) -> None:
    """``sys.unraisablehook`` while a filesystem is built: a half-built fsspec instance whose
    ``__del__`` fails (FTP's, when the constructor raised before connecting) says nothing; the
    constructor's own error is reported. Anything else goes to the saved hook."""
    obj = unraisable.object
    if getattr(obj, "__name__", "") == "__del__" and \
            str(getattr(obj, "__module__", "")).startswith("fsspec"):
        return
    (_saved_hook or sys.__unraisablehook__)(unraisable)


@contextlib.contextmanager
def _quiet_half_built() -> Iterator[None]:
    global _hook_users, _saved_hook
    with _hook_lock:
        if _hook_users == 0:
            _saved_hook = sys.unraisablehook
            sys.unraisablehook = _quiet_fsspec_finalizer
        _hook_users += 1
    try:
        yield
    finally:
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0:
                sys.unraisablehook = _saved_hook or sys.__unraisablehook__
                _saved_hook = None


def construct(factory: Callable[[str, Options], T], scheme: str, options: Options) -> T:
    """``factory(scheme, options)``; when it fails, the half-built instance its frames hold is
    released at once (its finalizer silenced), not at exit where it would print a traceback."""
    import gc
    import traceback

    with _quiet_half_built():
        try:
            return factory(scheme, options)
        except BaseException as e:
            traceback.clear_frames(e.__traceback__)
            gc.collect()
            raise


class FsspecFileSystem:
    """Any scheme fsspec knows (``s3``, ``hdfs``, ``gs``, ``abfs``, ``memory`` ...)."""

    def __init__(self, scheme: str, storage_options: Mapping[str, object]) -> None:
        import fsspec  # the only fsspec import in statequery

        self.scheme = scheme
        if scheme in ("hdfs", "viewfs", "arrow_hdfs"):
            with _quiet_stderr():
                self.fs = fsspec.filesystem(scheme, **storage_options)
        elif scheme in URL_SCHEMES:
            # no redirect is followed (3xx is RedirectRefusedError, see _refuse_redirect), and
            # URLs are sent as given: normalize_location made them canonical, the client must
            # not decode or normalise them again (what was confined is what is requested)
            options = {**storage_options, "allow_redirects": False, "encoded": True,
                       "get_client": _http_client}
            self.fs = fsspec.filesystem(scheme, **options)
        else:
            self.fs = fsspec.filesystem(scheme, **storage_options)

    def open(self, location: str) -> IO[bytes]:
        # no read-ahead cache: statequery plans its ranged reads (adjacent key groups coalesced),
        # so each read is one request of exactly the bytes asked for (a lookup in a large file
        # must not fetch a 50 MB block)
        try:
            return self.fs.open(location, "rb", cache_type="none")  # type: ignore[no-any-return]
        except TypeError:  # an implementation without fsspec's buffered-file options
            return self.fs.open(location, "rb")  # type: ignore[no-any-return]

    def size(self, location: str) -> int:
        return int(self.fs.size(location))

    def exists(self, location: str) -> bool:
        if self.scheme in URL_SCHEMES:  # fsspec's isfile would answer False for a redirect
            try:
                self.fs.info(location)
            except FileNotFoundError as e:
                refused = refusal_in(e)
                if refused is not None:
                    raise RedirectRefusedError(str(refused)) from e
                return False
            return True
        return bool(self.fs.isfile(location))

    def is_dir(self, location: str) -> bool:
        return bool(self.fs.isdir(location))

    def list_dir(self, location: str) -> list[str]:
        return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(location, detail=False)]

    def write_atomic(self, location: str, data: bytes) -> None:
        """Object stores (one PUT is atomic): written directly; other filesystems: a temporary
        name, then a move."""
        if self.scheme in OBJECT_STORES:
            with self.fs.open(location, "wb") as f:
                f.write(data)
            return
        tmp = location + ".statequery-tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, location)
