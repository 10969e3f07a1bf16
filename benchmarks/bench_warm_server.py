"""How long ``statequery sql --spark`` takes against a warm ``statequery serve``: prints figures.

    python benchmarks/bench_warm_server.py [--repeat 10] [--master local[2]] [--json]

Starts a server on a temporary metastore folder (the shipped catalog attached; or uses the one
that runs on ``--spark-dir``), then runs, each ``--repeat`` times one after the other:

* ``statequery sql --spark --json "SELECT key, value FROM user_activity.user_state__count
  WHERE key = 'user-3'"`` as a fresh process: wall clock from start to exit (what a user waits
  for), and the part the command itself reports for the server (``ran on the server ... in``);
* ``python -c "import statequery.cli.spark, statequery.cli.connect"`` plus the imports the
  client path makes (grpc, pyarrow): the client's own start-up;
* the same query through ``statequery.cli.connect.run_sql`` in this process (no start-up);
* ``statequery shell -e "SHOW DATABASES"`` as a fresh process, start to exit: the shell on
  Spark Connect, and ``--beeline`` (the JDBC shell, a JVM), taking turns.

Prints the load average before and after: the machine's 2 cores are shared, so compare only
figures of one run. Stops the server it started.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUERY = "SELECT key, value FROM user_activity.user_state__count WHERE key = 'user-3'"


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "statequery.cli", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=1800)


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--spark-dir", help="use the server that runs there (default: start one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    folder = Path(args.spark_dir) if args.spark_dir else Path(tempfile.mkdtemp(prefix="sq-warm-"))
    env = dict(os.environ, STATEQUERY_SPARK_DIR=str(folder), PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    figures: dict[str, object] = {"load_before": _load(), "query": QUERY}
    started_here = False
    if not (folder / "server.json").exists():
        t = time.monotonic()
        start = _cli(["serve", "--master", args.master], env)
        if start.returncode != 0:
            print(start.stderr, file=sys.stderr)
            return 1
        started_here = True
        figures["serve_start_s"] = round(time.monotonic() - t, 1)
    info = json.loads((folder / "server.json").read_text())
    try:
        first = _cli(["sql", "--spark", "--json", QUERY], env)  # not counted
        assert first.returncode == 0, first.stderr
        walls, servers = [], []
        for _ in range(args.repeat):
            t = time.monotonic()
            run = _cli(["sql", "--spark", "--json", QUERY], env)
            walls.append(time.monotonic() - t)
            assert run.returncode == 0, run.stderr
            assert json.loads(run.stdout) == {"key": "user-3", "value": 10}, run.stdout
            found = re.search(r"ran on the server at \S+ in ([0-9.]+) s", run.stderr)
            assert found, run.stderr
            servers.append(float(found.group(1)))
        figures["sql_spark_wall_s"] = _summary(walls)
        figures["sql_spark_reported_s"] = _summary(servers)

        imports = []
        for _ in range(args.repeat):
            t = time.monotonic()
            subprocess.run([sys.executable, "-c", "import statequery.cli, statequery.cli.spark, "
                            "statequery.cli.connect, grpc, pyarrow"], check=True, env=env)
            imports.append(time.monotonic() - t)
        figures["client_start_s"] = _summary(imports)

        sys.path.insert(0, str(ROOT))
        from statequery.cli.connect import run_sql
        from statequery.serverinfo import server_token

        inproc = []
        for _ in range(args.repeat):
            t = time.monotonic()
            table = run_sql(info["host"], int(info["connect_port"]), QUERY,
                            token=server_token(info))
            inproc.append(time.monotonic() - t)
            assert table.to_pylist() == [{"key": "user-3", "value": 10}]
        figures["query_in_process_s"] = _summary(inproc)

        databases = ["default", "user_activity", "user_activity_rocksdb", "word_counts"]
        shells: dict[str, list[float]] = {"shell_e_connect_s": [], "shell_e_beeline_s": []}
        for _ in range(args.repeat):
            for key, extra in (("shell_e_connect_s", []), ("shell_e_beeline_s", ["--beeline"])):
                t = time.monotonic()
                run = _cli(["shell", *extra, "-S", "-e", "SHOW DATABASES"], env)
                shells[key].append(time.monotonic() - t)
                assert run.returncode == 0, run.stderr
                assert [ln for ln in run.stdout.splitlines() if ln.strip()] == databases, \
                    run.stdout
        for key, values in shells.items():
            figures[key] = _summary(values)
    finally:
        if started_here:
            _cli(["serve", "--stop"], env)
    figures["load_after"] = _load()
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
