"""A real Flink 2.3 session cluster on loopback, for the live capture test.

The Flink distribution is the one the ``apache-flink`` wheels ship (``pyflink/bin``, ``conf``,
``lib``, ``opt``). It is found as ``$STATEQUERY_FLINK_HOME``, else the ``pyflink`` package of this
interpreter, else a cached install under ``$STATEQUERY_FLINK_CACHE`` (default
``~/.cache/statequery/flink-2.3.0``), made on first use with
``pip install --no-deps --target DIR apache-flink==2.3.0 apache-flink-libraries==2.3.0``: only
the two wheels that hold the scripts and the jars, not PyFlink's Python dependencies.

The cluster (one JobManager, one TaskManager, 1 GB each) runs from a private configuration
directory under a temporary directory: every address 127.0.0.1, free ports, logs beside it. Its
two JVMs are this process's grandchildren (``timeout LIFETIME jobmanager.sh|taskmanager.sh
start-foreground``, which exec java), stopped on exit, by a watchdog after ``lifetime`` seconds,
and by ``timeout`` even when this process dies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLINK_VERSION = "2.3.0"


def flink_home(install: bool = True) -> Path | None:
    """The directory holding ``bin/``, ``conf/``, ``lib/`` and ``opt/`` of Flink 2.3.0."""
    env = os.environ.get("STATEQUERY_FLINK_HOME")
    if env:
        return Path(env)
    try:
        import pyflink

        home = Path(pyflink.__file__).parent
        if (home / "bin" / "flink-console.sh").exists() and (home / "lib").is_dir():
            return home
    except ImportError:
        pass
    cache = Path(os.environ.get("STATEQUERY_FLINK_CACHE")
                 or Path.home() / ".cache" / "statequery" / f"flink-{FLINK_VERSION}")
    home = cache / "pyflink"
    if (home / "bin" / "flink-console.sh").exists() and (home / "lib").is_dir():
        return home
    if not install:
        return None
    tmp = cache.with_name(cache.name + f".partial-{os.getpid()}")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
         f"apache-flink=={FLINK_VERSION}", f"apache-flink-libraries=={FLINK_VERSION}"],
        check=True,
    )
    if cache.exists():
        shutil.rmtree(cache)
    tmp.rename(cache)
    return home


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FlinkCluster:
    home: Path
    root: Path  # the private directory: conf/, log/, savepoints/, checkpoints/
    rest_port: int
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def conf_dir(self) -> Path:
        return self.root / "conf"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["FLINK_CONF_DIR"] = str(self.conf_dir)
        env["FLINK_LOG_DIR"] = str(self.root / "log")
        env.pop("FLINK_HOME", None)
        env.pop("_JAVA_OPTIONS", None)
        return env

    def get(self, path: str, timeout: float = 30.0) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.loads(r.read())

    def post(self, path: str, body: Any = None, timeout: float = 60.0) -> Any:
        data = b"" if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")

    def upload_jar(self, jar: Path) -> str:
        boundary = uuid.uuid4().hex
        body = (
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"jarfile\"; "
            f"filename=\"{jar.name}\"\r\nContent-Type: application/x-java-archive\r\n\r\n"
        ).encode() + jar.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
        req = urllib.request.Request(
            self.url + "/jars/upload", data=body, method="POST",
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        with urllib.request.urlopen(req, timeout=120) as r:
            doc = json.loads(r.read())
        return str(doc["filename"]).rsplit("/", 1)[-1]

    def run_jar(self, jar_id: str, entry_class: str) -> str:
        doc = self.post(f"/jars/{jar_id}/run", {"entryClass": entry_class}, timeout=180)
        return str(doc["jobid"])

    def wait_running(self, job_id: str, timeout: float = 180.0) -> dict[str, Any]:
        """Wait until the job and every vertex run; returns ``/jobs/:id``."""
        deadline = time.monotonic() + timeout
        doc: dict[str, Any] = {}
        while time.monotonic() < deadline:
            doc = self.get(f"/jobs/{job_id}")
            if doc["state"] in ("FAILED", "CANCELED", "FINISHED"):
                raise RuntimeError(f"job {job_id} is {doc['state']}")
            if doc["state"] == "RUNNING" and all(
                v["status"] == "RUNNING" for v in doc.get("vertices", [])
            ):
                return doc
            time.sleep(1)
        raise TimeoutError(f"job {job_id} not running after {timeout} s: {doc.get('state')}")

    def jobs(self) -> list[dict[str, Any]]:
        return list(self.get("/jobs/overview")["jobs"])

    def sql(self, script: str, timeout: float = 300.0) -> None:
        """Run a SQL script with the SQL client against this cluster (INSERTs are submitted
        and not waited for)."""
        path = self.root / f"script-{uuid.uuid4().hex[:8]}.sql"
        path.write_text(script)
        result = subprocess.run(
            [str(self.home / "bin" / "sql-client.sh"), "-f", str(path)],
            env=self.env(), capture_output=True, timeout=timeout, text=True,
        )
        if result.returncode != 0 or "[ERROR]" in result.stdout:
            raise RuntimeError(f"sql-client failed ({result.returncode}):\n{result.stdout}\n"
                               f"{result.stderr}")

    def stop(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=15)


def _config(root: Path, rest_port: int) -> str:
    conf: dict[str, Any] = {
        "jobmanager.rpc.address": "127.0.0.1",
        "jobmanager.rpc.port": free_port(),
        "jobmanager.bind-host": "127.0.0.1",
        "jobmanager.memory.process.size": "1g",
        "taskmanager.bind-host": "127.0.0.1",
        "taskmanager.host": "127.0.0.1",
        "taskmanager.rpc.port": free_port(),
        "taskmanager.data.port": free_port(),
        "taskmanager.numberOfTaskSlots": 4,
        "taskmanager.memory.process.size": "1g",
        "taskmanager.memory.managed.size": "64m",
        "blob.server.port": free_port(),
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "rest.port": rest_port,
        "parallelism.default": 1,
        "state.backend.type": "hashmap",
        "execution.checkpointing.storage": "filesystem",
        "execution.checkpointing.dir": (root / "checkpoints").as_uri(),
        "execution.checkpointing.savepoint-dir": (root / "savepoints").as_uri(),
        "execution.checkpointing.data-inline-threshold": "0b",
        "execution.checkpointing.local-backup.enabled": "false",
        "execution.checkpointing.num-retained": 3,
        "pipeline.max-parallelism": 128,
        "metrics.reporters": "",
        "web.submit.enable": "true",
        "web.upload.dir": str(root / "upload"),
        "io.tmp.dirs": str(root / "tmp"),
    }
    return "".join(f"{k}: {json.dumps(v) if isinstance(v, str) else v}\n"
                   for k, v in conf.items())


@contextmanager
def flink_session_cluster(lifetime: float = 900.0, root: Path | None = None
                          ) -> Iterator[FlinkCluster]:
    """Start a session cluster; yield it when its REST API answers and a TaskManager has
    registered; kill it on exit or after ``lifetime`` seconds."""
    home = flink_home()
    assert home is not None
    import tempfile

    owned = root is None
    root = Path(tempfile.mkdtemp(prefix="statequery-flink-")) if root is None else root
    for d in ("conf", "log", "upload", "tmp", "savepoints", "checkpoints"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for f in (home / "conf").iterdir():
        if f.name.startswith("log4j"):
            shutil.copy(f, root / "conf" / f.name)
    java_opts = ""
    for line in (home / "conf" / "config.yaml").read_text().splitlines():
        if line.strip().startswith("all: --add-exports"):
            java_opts = line.strip()[len("all: "):]
    rest_port = free_port()
    cluster = FlinkCluster(home, root, rest_port)
    (root / "conf" / "config.yaml").write_text(
        _config(root, rest_port) + f"env.java.opts.all: {json.dumps(java_opts)}\n")
    stop = threading.Event()

    def watchdog() -> None:
        if not stop.wait(lifetime):
            cluster.stop()

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        # start-foreground: the scripts exec flink-console.sh, which execs java (our children)
        for script in ("jobmanager.sh", "taskmanager.sh"):
            log = open(root / "log" / f"{script}.out", "wb")  # noqa: SIM115 - closed with the JVM
            cluster.processes.append(subprocess.Popen(
                # timeout(1): the JVM dies after ``lifetime`` even if this process is killed
                # (SIGTERM from stop() is passed on to it)
                ["timeout", "--kill-after=15", str(int(lifetime)), str(home / "bin" / script),
                 "start-foreground"], env=cluster.env(), stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            ))
        deadline = time.monotonic() + 240
        while True:
            for p in cluster.processes:
                if p.poll() is not None:
                    raise RuntimeError(f"a Flink process exited ({p.returncode}); logs in "
                                       f"{root / 'log'}")
            try:
                if cluster.get("/overview", timeout=5)["taskmanagers"] >= 1:
                    break
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Flink cluster did not start; logs in {root / 'log'}")
            time.sleep(1)
        yield cluster
    finally:
        stop.set()
        cluster.stop()
        if owned and not os.environ.get("STATEQUERY_KEEP_FLINK"):
            shutil.rmtree(root, ignore_errors=True)


JOB_SOURCES = [
    Path(__file__).parents[2] / "examples" / "flink-jobs" / "src" / "statequery" / "fixtures"
    / name for name in ("CaptureStreamJob.java", "CaptureSqlJob.java")
]
#: the two job classes, prebuilt (``python tests/support/flinkcluster.py build-jar``), for machines
#: without a JDK (CI installs a JRE only)
PREBUILT_JAR = Path(__file__).parents[1] / "fixtures" / "flink-jobs" / "capture-jobs.jar"


def capture_jobs_jar(home: Path, workdir: Path) -> Path:
    """The jar of the capture test's jobs: compiled from examples/flink-jobs/src when ``javac``
    is on PATH, else the prebuilt one."""
    import zipfile

    if shutil.which("javac") is None:
        return PREBUILT_JAR
    classes = workdir / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["javac", "-nowarn", "--release", "17", "-encoding", "UTF-8", "-d", str(classes),
         "-cp", str(home / "lib") + "/*", *map(str, JOB_SOURCES)],
        check=True,
    )
    jar = workdir / "capture-jobs.jar"
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
        for f in sorted(classes.rglob("*.class")):
            info = zipfile.ZipInfo(str(f.relative_to(classes)), (1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, f.read_bytes())
    return jar


if __name__ == "__main__" and sys.argv[1:] == ["install"]:
    # .ci/run: the Flink distribution for the live capture test, before the tests run (they
    # then need nothing but loopback)
    started = time.monotonic()
    print(f"Flink {FLINK_VERSION} distribution: {flink_home()} "
          f"({time.monotonic() - started:.1f} s)")

if __name__ == "__main__" and sys.argv[1:] == ["build-jar"]:
    import tempfile

    found = flink_home(install=False)
    assert found is not None, "no Flink distribution (set STATEQUERY_FLINK_HOME)"
    with tempfile.TemporaryDirectory() as d:
        built = capture_jobs_jar(found, Path(d))
        PREBUILT_JAR.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(built, PREBUILT_JAR)
    print(PREBUILT_JAR)
