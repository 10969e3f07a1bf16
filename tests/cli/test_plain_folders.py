"""A folder that holds no savepoint is not called one "still being written": a checkpoint's
``shared/`` folder, a job directory whose checkpoints are gone, any folder of other files say
that they hold no savepoint and what they hold. A savepoint or checkpoint Flink has not finished
(named as Flink names them, or holding its state files) is still "still being written"
(tests/cli/test_user_mistakes.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from statequery.cli import main

ROOT = Path(__file__).resolve().parents[2]
#: a RocksDB incremental checkpoint job directory: chk-N folders, shared/ and taskowned/
JOB = next(p for p in (ROOT / "tests" / "fixtures" / "sequence-rocksdb-incremental").iterdir()
           if (p / "shared").is_dir())


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("statequery: "), err
    return err[len("statequery: "):].rstrip("\n")


def test_the_fixture_is_a_job_directory_with_a_shared_folder() -> None:
    assert (JOB / "shared").is_dir() and any((JOB / "shared").iterdir())
    assert any(p.name.startswith("chk-") for p in JOB.iterdir())


def test_a_checkpoints_shared_folder_holds_no_savepoint(
        capsys: pytest.CaptureFixture[str]) -> None:
    shared = JOB / "shared"
    n = len([p for p in shared.iterdir() if not p.name.startswith(".")])
    assert _error(capsys, "inspect", str(shared)) == (
        f"no savepoint or checkpoint at {shared}: it holds no savepoint: it is the shared/ folder "
        f"of a checkpointed job ({n} {'entry' if n == 1 else 'entries'}, the files its "
        f"incremental checkpoints share); give the job directory {JOB} or one of its chk-N "
        "checkpoints")


def test_a_job_directory_without_checkpoints_lists_what_it_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job"
    job.mkdir()
    shutil.copytree(JOB / "shared", job / "shared")
    (job / "taskowned").mkdir()
    error = _error(capsys, "lookup", str(job), "user-3")
    assert error.startswith(
        f"no savepoint or checkpoint at {job}: it holds no savepoint, only a shared/ folder and "
        "a taskowned/ folder; expected a directory holding _metadata")
    assert "still being written" not in error


def test_a_folder_of_other_things_lists_them(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    for name in ("b.txt", "a.txt", "c.csv", "d.json"):
        (folder / name).write_text("x")
    (folder / "plots").mkdir()
    (folder / "jobs" / "0a1b" / "chk-7").mkdir(parents=True)  # a checkpoint Flink never finished
    (folder / "jobs" / "0a1b" / "chk-12").mkdir(parents=True)
    error = _error(capsys, "inspect", str(folder))
    assert error.startswith(
        f"no savepoint or checkpoint at {folder}: it holds no savepoint, only 2 folders (jobs/, "
        "plots/) and 4 files (a.txt, b.txt, c.csv, ...); expected a directory holding _metadata")
    # checkpoints below a folder: named
    error = _error(capsys, "inspect", str(folder / "jobs"))
    assert error.startswith(
        f"no savepoint or checkpoint at {folder / 'jobs'}: it holds no savepoint, only "
        "checkpoints below it (0a1b/chk-7, 0a1b/chk-12) with no _metadata; expected")


def test_an_unfinished_savepoint_is_still_being_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a copy of a savepoint (its state files) under a name of the user's, without _metadata
    copy = tmp_path / "my-savepoint"
    shutil.copytree(ROOT / "catalog" / "user_activity" / "savepoint-3305c6-b004b8ed05c4", copy)
    (copy / "_metadata").unlink()
    assert "still being written, or was never completed" in _error(capsys, "inspect", str(copy))
