"""The history fixtures (issue 34): a job's checkpoint directory retaining several consecutive
checkpoints, with the oracle's dump of every version. See docs/fixtures.md, "The history series".

    python examples/flink-jobs/generate_history_fixtures.py            # both
    python examples/flink-jobs/generate_history_fixtures.py --only history-hashmap

Runs ``HistoryJob.java`` (Flink 2.3.0 MiniCluster), copies its output tree (``<job-id>/chk-*`` and
``shared/``) to ``tests/fixtures/<name>/`` and dumps every checkpoint with ``SavepointDump`` to
``tests/fixtures/dump/<name>-chk-<id>.jsonl``. The expected change feed between two consecutive
versions is the difference of their dumps (computed by the tests, not stored).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import generate_fixtures as gf  # noqa: E402

HISTORY = [
    {"name": "history-hashmap", "backend": "hashmap", "incremental": False, "checkpoints": 6},
    {"name": "history-rocksdb-incremental", "backend": "rocksdb", "incremental": True,
     "checkpoints": 6},
    # 3 checkpoints, then a new job (new job id) restored from the third at parallelism 3
    {"name": "history-rescaled", "backend": "rocksdb", "incremental": True, "checkpoints": 3,
     "restore_parallelism": 3},
    # the changelog state backend (hashmap underneath): 2 checkpoints of the change log alone,
    # then a materialization, then 4 with the log since on top (ChangelogHistoryJob.java). With
    # a 64 s interval its 8 keyed subtasks first materialize 35-57 s after the start
    # (murmurHash of their operator identifiers) after their tasks start, some seconds after the
    # job (95 s: all of them), the second time from 99 s on
    {"name": "history-changelog", "backend": "hashmap", "changelog": True, "checkpoints": 6,
     "log_only": 2, "interval": "64s", "wait": "95s"},
]

#: the operator whose MERGE_NS needs the job's ReduceFunction: Flink's own restore of a version
#: whose change log merges two of its sessions fails (the function is not known at restore), so
#: the oracle's dump has no entries of it there and reports that error (and no other)
UNRESTORABLE_UID = "session-bridged"


def generate(series: dict, scratch_root: Path) -> None:
    name = series["name"]
    scratch = scratch_root / name
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    out = scratch / "out"
    if series.get("changelog"):
        chks = _run_changelog_job(series, out, scratch)
    else:
        chks = _run_job(series, out, scratch, "job")
    if "restore_parallelism" in series:
        chks += _run_job(series, out, scratch, "restored", chks[-1],
                         series["restore_parallelism"])
    for old in (gf.FIXTURES / "dump").glob(f"{name}-chk-*.jsonl"):
        old.unlink()
    for chk in chks:  # dumped where the job wrote them (absolute handles exist there)
        dump = gf.FIXTURES / "dump" / f"{name}-{chk.name}.jsonl"
        log = scratch / f"dump-{chk.name}.log"
        if not gf.run_dump(chk, dump, log) and not _only_unrestorable(series, log):
            raise RuntimeError(f"SavepointDump failed, see {log}")
    dest = gf.FIXTURES / name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(out, dest)
    size = gf.du(dest)
    if size > gf.MAX_FIXTURE_BYTES:
        raise RuntimeError(f"{name} is {size} bytes, over the {gf.MAX_FIXTURE_BYTES} byte budget")
    print(f"  {name}: {size} bytes, {len(chks)} checkpoints")


def _run_job(series: dict, out: Path, scratch: Path, label: str,
             restore: Path | None = None, parallelism: int = 2) -> list[Path]:
    cmd = ["java", "-cp", gf.build(), "statequery.fixtures.HistoryJob", series["backend"],
           str(series["incremental"]).lower(), str(out), str(series["checkpoints"])]
    if restore is not None:
        cmd += [str(restore), str(parallelism)]
    t0 = time.time()
    with open(scratch / f"{label}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"HistoryJob failed ({proc.returncode}), see {scratch / label}.log")
    lines = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    print(f"  {series['name']}: {label} {lines.get('JOB_ID')} took {time.time() - t0:.1f}s")
    return [Path(lines[f"CHECKPOINT_{n}"]) for n in range(1, series["checkpoints"] + 1)]


def _only_unrestorable(series: dict, log: Path) -> bool:
    """A changelog dump whose only errors are those of :data:`UNRESTORABLE_UID`."""
    if not series.get("changelog"):
        return False
    errors = [line for line in log.read_text().splitlines() if "SavepointDump ERROR" in line]
    op = gf.operator_id_for_uid(UNRESTORABLE_UID)
    return bool(errors) and all(op in line for line in errors)


def _run_changelog_job(series: dict, out: Path, scratch: Path) -> list[Path]:
    cmd = ["java", "-cp", gf.build(), "statequery.fixtures.ChangelogHistoryJob",
           series["backend"], str(out), str(series["checkpoints"]), str(series["log_only"]),
           series["interval"], series["wait"]]
    t0 = time.time()
    with open(scratch / "job.log", "w") as log:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"ChangelogHistoryJob failed ({proc.returncode}), see {scratch}/job.log")
    lines = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    print(f"  {series['name']}: {lines.get('JOB_ID')} took {time.time() - t0:.1f}s")
    return [Path(lines[f"CHECKPOINT_{n}"]) for n in range(1, series["checkpoints"] + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="a fixture name (repeatable)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="statequery-history-") as scratch:
        for series in HISTORY:
            if args.only and series["name"] not in args.only:
                continue
            generate(series, Path(scratch))


if __name__ == "__main__":
    main()
