"""A Spark standalone cluster on loopback, started from the installed pyspark, for tests and
benchmarks: one master and N workers (1 core and a little memory each), work directories in a
temporary folder, a bounded lifetime.

Nothing here imports statequery or pyspark (only the location of the pyspark installation is
looked up), so the module serves the tests, ``benchmarks/`` and anyone who wants a throw-away
cluster::

    with StandaloneCluster(workers=2, lifetime=600) as cluster:
        spark = SparkSession.builder.master(cluster.master_url).config(...).getOrCreate()

Every process is started in its own session (process group) and killed with its group (the
worker's executors and their Python workers included) when the context exits. A watchdog
process, started first and detached from the caller, kills them too when ``lifetime`` seconds
have passed or the process that started the cluster has died (a crashed or killed test run), so
no Spark daemon survives the run that needed it. ``python tests/support/cluster.py --workers 2``
starts one by hand and prints its master URL.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["ClusterError", "StandaloneCluster", "spark_home"]


class ClusterError(RuntimeError):
    """The cluster did not come up (the message carries the tail of the daemon's log)."""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package (``bin/spark-class`` ...)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ClusterError("pyspark is not installed")
    return Path(spec.origin).parent


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class StandaloneCluster:
    """A master and ``workers`` workers on 127.0.0.1 (``spark://127.0.0.1:<free port>``).

    ``worker_memory`` is what each worker offers to executors (an application's
    ``spark.executor.memory`` must fit in it, see :meth:`spark_conf`); ``lifetime`` bounds how
    long anything started here may live; ``env`` is added to the daemons' environment (and so to
    the executors and their Python workers).
    """

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        worker_memory: str = "1g",
        lifetime: float = 600.0,
        env: Mapping[str, str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        python: str | None = None,
    ) -> None:
        self.workers = workers
        self.cores = cores
        self.worker_memory = worker_memory
        self.lifetime = lifetime
        self.python = python or sys.executable
        self._extra_env = dict(env or {})
        self._base_dir = base_dir
        self._own_dir = False
        self.dir = Path()
        self.master_url = ""
        self.master_ui = ""
        self.procs: list[subprocess.Popen[bytes]] = []
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def env(self) -> dict[str, str]:
        """The environment of the daemons (and of drivers that should match them)."""
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",  # RPC and web UIs bind to loopback only
            SPARK_LOCAL_HOSTNAME="127.0.0.1",
            SPARK_LOCAL_DIRS=str(self.dir / "local"),
            SPARK_DAEMON_MEMORY="256m",
            # no REST submission server (it would take the fixed port 6066)
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            PYSPARK_PYTHON=self.python,
            PYSPARK_DRIVER_PYTHON=self.python,
        )
        env.pop("SPARK_CONF_DIR", None)
        env.update(self._extra_env)
        return env

    def start(self) -> None:
        started = time.monotonic()
        if self._base_dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="statequery-spark-cluster-"))
            self._own_dir = True
        else:
            self.dir = Path(self._base_dir)
            self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "local").mkdir(exist_ok=True)
        self._start_watchdog()
        try:
            master_log = self.dir / "master.log"
            self._spawn(
                ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", "0", "--webui-port", "0"],
                master_log,
            )
            found = self._wait_for(master_log, r"Starting Spark master at (spark://\S+)", 120)
            self.master_url = found.group(1)
            for i in range(self.workers):
                work = self.dir / f"worker-{i}"
                work.mkdir(exist_ok=True)
                self._spawn(
                    ["org.apache.spark.deploy.worker.Worker", self.master_url,
                     "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                     "--cores", str(self.cores), "--memory", self.worker_memory,
                     "--work-dir", str(work)],
                    self.dir / f"worker-{i}.log",
                )
            ui = self._wait_for(master_log, r"Bound MasterWebUI to \S+, and started at (\S+)", 60)
            self.master_ui = ui.group(1)
            self._wait_for(master_log, r"I have been elected leader", 60)
            for i in range(self.workers):  # workers retry until the master is up
                self._wait_for(
                    self.dir / f"worker-{i}.log", r"Successfully registered with master", 120
                )
            self.start_seconds = time.monotonic() - started
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill every process group started here (TERM, then KILL), then the watchdog."""
        groups = [p.pid for p in self.procs]
        _kill_groups(groups)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - KILL was sent
                pass
        self.procs = []
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        if self._own_dir and self.dir.is_dir():
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- what an application needs --------------------------------------------------------------

    def spark_conf(self, executor_memory: str = "512m") -> dict[str, str]:
        """Spark settings for an application on this cluster: one executor per worker, started
        before the first job (so tasks spread over all of them), nothing bound beyond loopback."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.executor.memory": executor_memory,
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.workers),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
            "spark.pyspark.python": self.python,
            "spark.pyspark.driver.python": self.python,
            "spark.local.dir": str(self.dir / "local"),
        }

    def track(self, proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
        """Put another process started with ``start_new_session=True`` (a driver, say) under
        the watchdog: it is killed with the cluster."""
        with open(self.dir / "groups", "a", encoding="ascii") as f:
            f.write(f"{proc.pid}\n")

    def executor_dirs(self) -> list[Path]:
        """``worker-N/<app id>/<executor id>``: the working directories of the executors."""
        return sorted(p for p in self.dir.glob("worker-*/app-*/*") if p.is_dir())

    def logs(self) -> str:
        """The tails of every daemon log, for a failure message."""
        out = []
        for log in sorted(self.dir.glob("*.log")):
            out.append(f"--- {log.name}\n{_log_tail(log)}")
        return "\n".join(out)

    # -- internals ------------------------------------------------------------------------------

    def _spawn(self, args: Sequence[str], log: Path) -> None:
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, cwd=self.dir, start_new_session=True,
            )
        self.procs.append(proc)
        with open(self.dir / "groups", "a", encoding="ascii") as f:
            f.write(f"{proc.pid}\n")

    def _wait_for(self, log: Path, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            try:
                found = regex.search(log.read_text(errors="replace"))
            except OSError:
                found = None
            if found:
                return found
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise ClusterError(
                    f"a Spark daemon exited with code {dead[0].returncode}:\n{self.logs()}"
                )
            time.sleep(0.2)
        raise ClusterError(f"no {pattern!r} in {log.name} after {timeout:.0f} s:\n{self.logs()}")

    def _start_watchdog(self) -> None:
        (self.dir / "groups").touch()
        self._watchdog = subprocess.Popen(
            [sys.executable, __file__, "--watchdog", str(os.getpid()), str(self.lifetime),
             str(self.dir / "groups")],
            stdin=subprocess.DEVNULL, start_new_session=True,
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's pid
        return True
    try:  # a zombie child of the caller counts as dead
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _kill_groups(groups: Sequence[int], grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        sent = False
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
                sent = True
            except (ProcessLookupError, PermissionError):
                pass
        if not sent or sig == signal.SIGKILL:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not any(_group_alive(g) for g in groups):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies waiting to be reaped do not)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    if not os.path.isdir("/proc/self"):  # pragma: no cover - not Linux
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # state, ppid, pgrp
            return True
    return False


def _watchdog(parent: int, lifetime: float, groups_file: str) -> None:
    """Kill the process groups listed in ``groups_file`` once ``parent`` has died or
    ``lifetime`` seconds have passed; exit by itself once they are all gone."""
    deadline = time.monotonic() + lifetime
    seen: set[int] = set()
    while True:
        try:
            with open(groups_file, encoding="ascii") as f:
                groups = [int(line) for line in f if line.strip()]
        except OSError:
            groups = []
        seen.update(g for g in groups if _group_alive(g))
        if not _alive(parent) or time.monotonic() > deadline:
            why = "its starter died" if not _alive(parent) else f"lifetime {lifetime:.0f} s over"
            print(f"spark cluster watchdog: {why}, killing {sorted(seen)}", file=sys.stderr)
            _kill_groups(groups)
            return
        if seen and not any(_group_alive(g) for g in seen):
            return
        time.sleep(1.0)


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--watchdog"]:
        _watchdog(int(args[1]), float(args[2]), args[3])
        return
    ap = argparse.ArgumentParser(description="a throw-away Spark standalone cluster on loopback")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory", default="1g")
    ap.add_argument("--lifetime", type=float, default=3600)
    opts = ap.parse_args(args)
    with StandaloneCluster(opts.workers, worker_memory=opts.memory, lifetime=opts.lifetime) as c:
        print(f"master {c.master_url} (UI {c.master_ui}); logs in {c.dir}; Ctrl-C stops it")
        try:
            while all(p.poll() is None for p in c.procs):
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
