"""Generate the large savepoint the canonical benchmark reads (Flink 2.3 MiniCluster, no Maven).

Needs a JDK 17 and the ``fixtures`` extra (``apache-flink==2.3.0``; here ``/work/venv``).
Compiles ``benchmarks/flink/**/*.java`` against the wheel's jars and runs
``statequery.bench.LargeStateJob``: KEYS String keys, each with a value, a 3-element list, a
2-entry map, a reducing state and an event-time timer (``6 x KEYS`` entries).

    python benchmarks/make_large_savepoint.py --keys 1000000 --out /tmp/statequery-bench
    python benchmarks/make_large_savepoint.py --compression     # snappy key groups

A large RocksDB *native* savepoint (writing 1M random keys straight into RocksDB is slow on a
small machine; restoring a canonical savepoint into the RocksDB backend is fast): restore the
canonical one into the same job on the RocksDB backend, append one list element to every
``--append-every``-th key (un-compacted RocksDB merge operands), then take a NATIVE savepoint and,
of the very same state, a canonical one to compare with:

    python benchmarks/make_large_savepoint.py --backend rocksdb \
        --restore /tmp/statequery-bench/hashmap/savepoint-* --append-every 10 \
        --kind savepoint-native,savepoint-canonical --out /tmp/statequery-bench/rocksdb-native

``--keys`` must then be the key count of the restored savepoint. Prints every savepoint
directory (``SNAPSHOT_PATH=...``), in the order of ``--kind``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def flink_lib(python: str) -> str:
    """The wheel's ``pyflink/lib``: ``$FLINK_LIB`` if set, else asked of ``python``."""
    if os.environ.get("FLINK_LIB"):
        return os.environ["FLINK_LIB"]
    out = subprocess.run(
        [
            python,
            "-c",
            "import os, pyflink; print(os.path.join(os.path.dirname(pyflink.__file__), 'lib'))",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def compile_job(python: str, build_dir: str = "") -> str:
    """Compile ``benchmarks/flink`` (and the fixture programs ``RestoreCount`` shares with the
    oracle, ``examples/flink-jobs/src``) against the wheel's jars; returns the classpath.

    ``build_dir``: where the classes go (default ``benchmarks/flink/build``); give each long run
    its own so that a later compile does not swap classes under a running JVM."""
    lib = flink_lib(python)
    build = Path(build_dir) if build_dir else HERE / "flink" / "build"
    build.mkdir(parents=True, exist_ok=True)
    fixtures = HERE.parent / "examples" / "flink-jobs" / "src"
    sources = sorted(str(p) for d in (HERE / "flink", fixtures) for p in d.rglob("*.java"))
    subprocess.run(
        ["javac", "-nowarn", "-encoding", "UTF-8", "-d", str(build), "-cp", f"{lib}/*", *sources],
        check=True,
    )
    return f"{lib}/*{os.pathsep}{build}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--backend", default="hashmap", choices=("hashmap", "rocksdb"))
    ap.add_argument("--compression", action="store_true")
    ap.add_argument(
        "--kind",
        default="savepoint-canonical",
        help="savepoint-canonical | savepoint-native | checkpoint-incremental (a chain of 3,"
        " RocksDB with --restore), several separated by commas",
    )
    ap.add_argument("--restore", default="", help="start from this savepoint directory")
    ap.add_argument(
        "--append-every",
        type=int,
        default=10,
        help="with --restore: append a list element to every N-th key (0: none)",
    )
    ap.add_argument("--out", default="/tmp/statequery-bench")
    ap.add_argument(
        "--python",
        default=os.environ.get("FLINK_PYTHON", "/work/venv/bin/python"),
        help="a Python with apache-flink 2.3.0 installed",
    )
    ap.add_argument("--heap", default="8g", help="JVM -Xmx")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.kind.split(",")]
    known = ("savepoint-canonical", "savepoint-native", "checkpoint-incremental")
    bad = [k for k in kinds if k not in known]
    if bad:
        ap.error(f"--kind: unknown {', '.join(bad)}")
    restore = ""
    if args.restore:
        restore = os.path.abspath(args.restore)
        if not os.path.isfile(os.path.join(restore, "_metadata")):
            ap.error(f"--restore: no _metadata in {restore}")
    cp = compile_job(args.python, os.path.join(args.out, ".classes"))
    cmd = [
        "java",
        f"-Xmx{args.heap}",
        "-cp",
        cp,
        "statequery.bench.LargeStateJob",
        str(args.keys),
        args.backend,
        str(args.compression).lower(),
        ",".join(kinds),
        args.out,
    ]
    if restore:
        cmd += [restore, str(args.append_every)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(("SNAPSHOT_PATH=", "CHECKPOINT_PATH=", "JOB_ID=")):
            print(line)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
