"""Capture: the StateMeta snapshot recorded when the savepoint is taken, from a running Flink.

Stock Flink's REST API gives everything statequery otherwise has to be told: this module

* takes a savepoint (``POST /jobs/:jobid/savepoints``, polling its trigger id) or finds the
  latest completed checkpoint (``GET /jobs/:jobid/checkpoints``),
* records the job (``/jobs/:jobid``: name, vertices with id, name, parallelism, max parallelism),
  its job graph (``/jobs/:jobid/plan``: every vertex's description, which for SQL operators
  carries the query's field names), its configuration (``/jobs/:jobid/config``,
  ``/jobs/:jobid/checkpoints/config``, ``/jobmanager/config``), the Flink version and the time,
* writes the StateMeta snapshot (:mod:`statequery.metadata.statemeta`, with its optional ``job``
  section) beside the savepoint, or at a location of the caller's choice.

Opening a captured savepoint names SQL state from the vertex descriptions
(:func:`statequery.metadata.plan.apply_descriptions`) when no compiled plan is attached.

:func:`follow` keeps the last K captured savepoints of a job in a catalog folder, one database
each, named by job and time (``statequery capture ... --catalog DIR --keep K [--every N]``).

Nothing here imports pyspark; the HTTP client is :mod:`urllib` (no new dependency).
"""

from __future__ import annotations

import datetime
import json
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from statequery.exceptions import InvalidOptionError, StatequeryError

if TYPE_CHECKING:  # imported when used: ``import statequery`` stays light
    from statequery.io import FileIO
    from statequery.metadata.statemeta import JobInfo

__all__ = [
    "CaptureError",
    "CaptureResult",
    "CaptureTimeoutError",
    "FlinkRest",
    "HttpRest",
    "SavepointFailedError",
    "capture",
    "follow",
]

#: the job-level and cluster configuration keys kept in the snapshot (values of everything else
#: may hold secrets: credentials of file systems, SSL passwords); prefixes end with ``.``
KEPT_CONFIG = (
    "state.backend.type",
    "state.backend.",
    "execution.checkpointing.",
    "state.checkpoints.",
    "state.savepoints.",
    "pipeline.max-parallelism",
    "parallelism.default",
    "pipeline.name",
    "table.exec.",
)
_SECRET = re.compile(r"(password|secret|token|credential|access[._-]?key|auth)", re.I)


class CaptureError(StatequeryError):
    """A capture failed (the job is not running, the REST API answered an error, no completed
    checkpoint, ...): nothing was written."""


class SavepointFailedError(CaptureError):
    """Flink reported that the savepoint failed (e.g. the job was cancelled); nothing was
    written."""


class CaptureTimeoutError(CaptureError):
    """The savepoint did not complete in time; nothing was written (Flink may still complete
    it later, without a StateMeta snapshot)."""


class FlinkRest(Protocol):
    """The few REST calls capture needs (a real client, or recorded responses in tests)."""

    url: str

    def get(self, path: str) -> Any: ...

    def post(self, path: str, body: Any) -> Any: ...


@dataclass
class HttpRest:
    """Flink's REST API at ``url`` through urllib; errors are :class:`CaptureError`."""

    url: str
    timeout: float = 30.0

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        scheme = urllib.parse.urlsplit(self.url).scheme
        if scheme not in ("http", "https"):
            raise InvalidOptionError(f"--rest {self.url}: expected an http:// or https:// URL")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        import urllib.error  # with http.client and ssl: imported when used
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = _rest_error(e.read())
            raise CaptureError(f"{method} {self.url}{path}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise CaptureError(f"{method} {self.url}{path}: {reason}") from None
        try:
            return json.loads(raw or b"{}")
        except (ValueError, RecursionError):  # json recurses once per nesting level
            raise CaptureError(f"{method} {self.url}{path}: the answer is not JSON") from None

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self._call("POST", path, body if body is not None else {})


def _rest_error(raw: bytes) -> str:
    """The first line of Flink's ``{"errors": [...]}`` answer."""
    try:
        errors = json.loads(raw).get("errors") or []
        text = str(errors[0]) if errors else raw.decode("utf-8", "replace")
    except (ValueError, AttributeError, LookupError, RecursionError):
        text = raw.decode("utf-8", "replace")
    return text.strip().splitlines()[0][:500] if text.strip() else "(no detail)"


@dataclass(frozen=True)
class CaptureResult:
    """What one capture did: the snapshot's location (``_metadata``'s directory), where the
    StateMeta snapshot was written, and the recorded job."""

    location: str
    snapshot: str
    job: JobInfo
    seconds: float = 0.0  # from the trigger to the completed savepoint (0: a checkpoint)


_JOB_ID = re.compile(r"^[0-9a-f]{32}$")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _kept(key: str, value: Any) -> bool:
    if _SECRET.search(key):
        return False
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in KEPT_CONFIG)


def _strings(d: dict[str, Any]) -> dict[str, str]:
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in d.items()}


def record_job(rest: FlinkRest, job_id: str) -> tuple[JobInfo, str]:
    """The job as the REST API describes it now, and its state (``RUNNING`` ...)."""
    from statequery.metadata.statemeta import JobInfo, JobVertex

    if not _JOB_ID.match(job_id or ""):
        raise InvalidOptionError(f"{job_id!r} is not a Flink job id (32 hex characters)")
    job = rest.get(f"/jobs/{job_id}")
    plan = rest.get(f"/jobs/{job_id}/plan").get("plan") or {}
    descriptions = {n.get("id"): n for n in plan.get("nodes") or [] if isinstance(n, dict)}
    vertices = []
    for v in job.get("vertices") or []:
        node = descriptions.get(v.get("id"), {})
        inputs = tuple(str(i.get("id")) for i in node.get("inputs") or [] if isinstance(i, dict))
        vertices.append(JobVertex(
            id=str(v["id"]), name=str(v.get("name", "")),
            parallelism=int(v.get("parallelism", 0)),
            max_parallelism=int(v.get("maxParallelism", 0)),
            description=str(node.get("description", "")), inputs=inputs,
        ))
    config: dict[str, str] = {}
    try:
        cluster = rest.get("/jobmanager/config")
        for kv in cluster if isinstance(cluster, list) else []:
            if _kept(str(kv.get("key")), kv.get("value")):
                config[str(kv["key"])] = str(kv.get("value"))
    except CaptureError:
        pass  # the cluster configuration is informative; some deployments hide it
    execution = rest.get(f"/jobs/{job_id}/config").get("execution-config") or {}
    checkpointing = {}
    try:
        checkpointing = rest.get(f"/jobs/{job_id}/checkpoints/config")
    except CaptureError:
        pass
    version = ""
    try:
        version = str(rest.get("/config").get("flink-version", ""))
    except CaptureError:
        pass
    info = JobInfo(
        job_id=job_id,
        job_name=str(job.get("name", "")),
        captured_at=_now(),
        rest_url=rest.url,
        flink_version=version,
        max_parallelism=int(job.get("maxParallelism", 0) or 0),
        vertices=tuple(vertices),
        config=config,
        execution_config=_strings({k: v for k, v in execution.items() if k != "user-config"}),
        checkpoint_config=_strings(checkpointing if isinstance(checkpointing, dict) else {}),
    )
    return info, str(job.get("state", ""))


def _local(location: str) -> str:
    """``file:/x`` and ``file:///x`` as ``/x``; other URIs unchanged (read through fsspec)."""
    if location.startswith("file:"):
        return urllib.parse.unquote(urllib.parse.urlsplit(location).path)
    return location


def trigger_savepoint(rest: FlinkRest, job_id: str, target: str | None, timeout: float,
                      native: bool = False, poll: float = 0.5,
                      sleep: Callable[[float], None] = time.sleep) -> str:
    """Trigger a savepoint and wait for it; its location. Typed errors on failure or timeout."""
    body: dict[str, Any] = {"cancel-job": False, "formatType": "NATIVE" if native else "CANONICAL"}
    if target is not None:
        body["target-directory"] = target
    trigger = rest.post(f"/jobs/{job_id}/savepoints", body).get("request-id")
    if not trigger:
        raise CaptureError(f"job {job_id}: Flink returned no savepoint trigger id")
    deadline = time.monotonic() + timeout
    while True:
        doc = rest.get(f"/jobs/{job_id}/savepoints/{trigger}")
        status = (doc.get("status") or {}).get("id")
        if status == "COMPLETED":
            op = doc.get("operation") or {}
            if op.get("location"):
                return str(op["location"])
            cause = op.get("failure-cause") or {}
            detail = _failure_text(cause)
            raise SavepointFailedError(f"job {job_id}: the savepoint failed: {detail}")
        if time.monotonic() >= deadline:
            raise CaptureTimeoutError(
                f"job {job_id}: the savepoint (trigger {trigger}) did not complete within "
                f"{timeout:g} s; nothing was written"
            )
        sleep(poll)


def _failure_text(cause: dict[str, Any]) -> str:
    trace = str(cause.get("stack-trace") or "")
    lines = [ln.strip() for ln in trace.splitlines() if ln.strip() and not ln.startswith("\t")]
    # the innermost "Caused by" says why (e.g. the job is not running)
    caused = [ln for ln in lines if ln.startswith("Caused by:")]
    text = caused[-1][len("Caused by:"):].strip() if caused else (lines[0] if lines else "")
    return text[:500] or str(cause.get("class") or "unknown cause")


def latest_checkpoint_path(rest: FlinkRest, job_id: str) -> str:
    """The external path of the job's latest completed checkpoint (or savepoint)."""
    doc = rest.get(f"/jobs/{job_id}/checkpoints")
    latest = (doc.get("latest") or {}).get("completed")
    if not latest or not latest.get("external_path"):
        raise CaptureError(f"job {job_id} has no completed checkpoint yet")
    return str(latest["external_path"])


def capture(
    rest: str | FlinkRest,
    job_id: str,
    *,
    savepoint: str | None = None,
    latest_checkpoint: bool = False,
    out: str | None = None,
    timeout: float = 600.0,
    native: bool = False,
    io: FileIO | None = None,
    storage_options: dict[str, Any] | None = None,
) -> CaptureResult:
    """Take a savepoint of ``job_id`` (into ``savepoint``, a target directory; default: the
    job's configured savepoint directory) or take its latest completed checkpoint
    (``latest_checkpoint``), record the job, and write the StateMeta snapshot beside it (or at
    ``out``). Raises :class:`SavepointFailedError`, :class:`CaptureTimeoutError` or
    :class:`CaptureError`; on any error nothing is written.
    """
    from statequery.io import FileIO
    from statequery.savepoint import Savepoint

    client = HttpRest(rest) if isinstance(rest, str) else rest
    if savepoint is not None and latest_checkpoint:
        raise InvalidOptionError("give --savepoint DIR or --latest-checkpoint, not both")
    job, state = record_job(client, job_id)
    started = time.monotonic()
    if latest_checkpoint:
        where = _local(latest_checkpoint_path(client, job_id))
        seconds = 0.0
    else:
        if state != "RUNNING":
            raise CaptureError(f"job {job_id} is {state or 'not running'}: no savepoint taken")
        where = _local(trigger_savepoint(client, job_id, savepoint, timeout, native))
        seconds = time.monotonic() - started
    job = replace(job, trigger="checkpoint" if latest_checkpoint else "savepoint",
                  location=where, captured_at=_now())
    io = io or FileIO(storage_options)
    sp = Savepoint.open(where, io=io, use_snapshot=False)
    written = sp.write_snapshot(out, job=job)
    return CaptureResult(location=sp.location, snapshot=written, job=job, seconds=seconds)



# -- following a job into a catalog -----------------------------------------------------------


def database_name(job_name: str, when: datetime.datetime | None = None) -> str:
    """``<job name>_<UTC time>``, e.g. ``order_stats_20261125t190501z``: SQL-safe, sorted by
    time within a job."""
    from statequery.metadata.statemeta import sql_identifier

    when = when or datetime.datetime.now(datetime.timezone.utc)
    stamp = when.strftime("%Y%m%dT%H%M%SZ").lower()
    return f"{sql_identifier(job_name)}_{stamp}"


@dataclass
class FollowState:
    captured: list[CaptureResult] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def follow(
    rest: str | FlinkRest,
    job_id: str,
    catalog: str,
    *,
    keep: int = 5,
    every: float | None = None,
    count: int | None = None,
    timeout: float = 600.0,
    native: bool = False,
    io: FileIO | None = None,
    storage_options: dict[str, Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_capture: Callable[[CaptureResult, list[str]], None] | None = None,
) -> FollowState:
    """Capture ``job_id`` into ``catalog`` (a folder the JobManager can write to), one database
    per savepoint: ``<catalog>/<job>_<time>/savepoint-.../``, with the StateMeta snapshot beside
    it. After each capture only the newest ``keep`` databases of this job are kept (older ones
    that capture made, recognised by their snapshot's job id, are deleted). With ``every``
    (seconds) it repeats until ``count`` captures (forever without ``count``); without ``every``
    it captures once (for cron)."""
    if keep < 1:
        raise InvalidOptionError("--keep must be at least 1")
    if every is not None and every <= 0:
        raise InvalidOptionError("--every must be a positive number of seconds")
    from statequery.io import FileIO, join_location

    client = HttpRest(rest) if isinstance(rest, str) else rest
    io = io or FileIO(storage_options)
    state = FollowState()
    n = 0
    while True:
        if not _JOB_ID.match(job_id or ""):
            raise InvalidOptionError(f"{job_id!r} is not a Flink job id (32 hex characters)")
        name = database_name(str(client.get(f"/jobs/{job_id}").get("name") or job_id))
        target = join_location(catalog, name)
        result = capture(client, job_id, savepoint=_uri(target), timeout=timeout,
                         native=native, io=io)
        state.captured.append(result)
        removed = prune(io, catalog, job_id, keep)
        state.removed.extend(removed)
        if on_capture is not None:
            on_capture(result, removed)
        n += 1
        if every is None or (count is not None and n >= count):
            return state
        sleep(every)


def _uri(location: str) -> str:
    """A target directory as Flink wants it: local paths as ``file://`` URIs."""
    if "://" in location:
        return location
    import os

    return "file://" + os.path.abspath(location)


def captured_databases(io: FileIO, catalog: str, job_id: str) -> list[tuple[str, str]]:
    """``(captured_at, database)`` of the catalog's databases captured from ``job_id``, oldest
    first (a database belongs to the job when its StateMeta snapshot's job section says so)."""
    from statequery.discovery import find_metadata_dir
    from statequery.io import join_location
    from statequery.metadata.statemeta import SNAPSHOT_FILE_NAME, read_snapshot

    out: list[tuple[str, str]] = []
    if not io.is_dir(catalog):
        return out
    for child in io.list_dir(catalog):
        db = join_location(catalog, child)
        if child.startswith(".") or not io.is_dir(db):
            continue
        found = find_metadata_dir(io, db)
        if found is None:
            continue
        snap = join_location(found, SNAPSHOT_FILE_NAME)
        if not io.new_input(snap).exists():
            continue
        try:
            meta = read_snapshot(io, snap)
        except StatequeryError:
            continue
        if meta.job is not None and meta.job.job_id == job_id:
            out.append((meta.job.captured_at, child))
    return sorted(out)


def prune(io: FileIO, catalog: str, job_id: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` databases captured from ``job_id``; their names.
    Only local catalog folders are pruned (a remote one raises :class:`InvalidOptionError`:
    use the storage's own lifecycle rules there)."""
    import os
    import shutil

    dbs = captured_databases(io, catalog, job_id)
    old = [name for _, name in dbs[: max(0, len(dbs) - keep)]]
    if old and "://" in catalog and not catalog.startswith("file://"):
        raise InvalidOptionError(
            f"--keep: {catalog} is not a local folder; statequery prunes only local catalogs"
        )
    root = _local(catalog)
    for name in old:
        shutil.rmtree(os.path.join(root, name))
    return old
