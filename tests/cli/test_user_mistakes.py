"""The obvious mistakes of a first session, each a one-line message saying what the path or
option is instead: a savepoint still being written (Flink writes ``_metadata`` last), an empty
directory, a file, a catalog folder that is missing or is itself a savepoint; every command that
opens a savepoint takes ``--storage-option``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from statequery.cli import main

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "catalog"
USER_ACTIVITY = CATALOG / "user_activity"
SAVEPOINT = next(USER_ACTIVITY.iterdir())
CHECKPOINT_JOB = next((ROOT / "tests" / "fixtures" / "datastream-hashmap-checkpoint").iterdir())


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line ``statequery argv`` prints on stderr, exiting 1."""
    assert main(list(argv)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("statequery: "), err
    return err[len("statequery: "):].rstrip("\n")


def test_a_savepoint_without_metadata_is_still_being_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a savepoint target directory while Flink writes savepoint-...: state files, no _metadata
    target = tmp_path / "savepoints"
    pending = target / "savepoint-3305c6-0123456789ab"
    shutil.copytree(SAVEPOINT, pending)
    (pending / "_metadata").unlink()
    assert _error(capsys, "inspect", str(pending)) == (
        f"no savepoint or checkpoint at {pending}: the directory holds no _metadata file: Flink "
        "writes it last, so this savepoint or checkpoint is still being written, or was never "
        "completed")
    assert _error(capsys, "read", str(target), "user_state__count") == (
        f"no savepoint or checkpoint at {target}: savepoint-3305c6-0123456789ab holds no "
        "_metadata file: Flink writes it last, so that savepoint is still being written, or was "
        "never completed")


def test_a_job_directory_whose_checkpoints_are_all_incomplete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job"
    shutil.copytree(CHECKPOINT_JOB, job)
    # a later checkpoint in progress: the latest complete one (chk-1) is read
    shutil.copytree(job / "chk-1", job / "chk-2")
    (job / "chk-2" / "_metadata").unlink()
    assert main(["inspect", str(job), "--json"]) == 0
    assert f'"location": "{job / "chk-1"}"' in capsys.readouterr().out
    assert "still being written" in _error(capsys, "inspect", str(job / "chk-2"))
    # none complete
    shutil.rmtree(job / "chk-1")
    assert _error(capsys, "lookup", str(job), "user-3") == (
        f"no savepoint or checkpoint at {job}: none of its checkpoints (chk-2) holds a _metadata "
        "file: Flink writes it last, when a checkpoint completes (still running, or failed)")


def test_missing_empty_and_file_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope"
    assert _error(capsys, "inspect", str(missing)) == (
        f"no savepoint or checkpoint at {missing}: no such file or directory")
    (tmp_path / "empty").mkdir()
    assert _error(capsys, "inspect", str(tmp_path / "empty")) == (
        f"no savepoint or checkpoint at {tmp_path / 'empty'}: the directory is empty")
    # a state file (or any file but _metadata)
    state_file = next(p for p in SAVEPOINT.iterdir() if p.name != "_metadata")
    assert _error(capsys, "inspect", str(state_file)) == (
        f"no savepoint or checkpoint at {state_file}: it is a file, not a _metadata file or a "
        "directory holding one")
    # a bare name is also looked up as a database of the default catalog
    monkeypatch.chdir(tmp_path)
    assert _error(capsys, "inspect", "user_activty") == (
        f"no savepoint or checkpoint at {tmp_path / 'user_activty'}: no such file or directory, "
        f"nor database of the default catalog ({CATALOG})")


def test_catalog_that_is_missing_or_is_a_savepoint(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT count(*) AS n FROM user_activity.user_state__count"
    assert _error(capsys, "sql", query, "--catalog", str(tmp_path / "nope")) == (
        f"catalog {tmp_path / 'nope'} does not exist")
    # the database folder instead of the catalog holding it
    assert _error(capsys, "sql", query, "--catalog", str(USER_ACTIVITY)) == (
        f"no savepoint database 'user_activity' in catalog {USER_ACTIVITY} "
        f"(databases: {SAVEPOINT.name}); {USER_ACTIVITY} is itself one savepoint or checkpoint "
        "(a database): name the folder that holds it as the catalog")
    assert main(["sql", query, "--catalog", str(CATALOG), "--json"]) == 0
    assert capsys.readouterr().out == '{"n": 20}\n'


@pytest.mark.parametrize("argv", [
    ["stats", str(USER_ACTIVITY)],
    ["diff", str(USER_ACTIVITY), str(USER_ACTIVITY)],
    ["splits", str(USER_ACTIVITY), "fixture-source"],
    ["export", str(USER_ACTIVITY), "user-state", "--out", "unused"],
])
def test_every_command_takes_storage_options(argv: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # parsed and used before anything is opened (a bad one is the option's error)
    assert _error(capsys, *argv, "--storage-option", "anon") == (
        "--storage-option 'anon': expected KEY=VALUE")


def test_splits_of_the_wrong_source_kind_say_where(capsys: pytest.CaptureFixture[str]) -> None:
    # the catalog job's own source is decoded (fixture); named as another kind, it does not fit
    assert _error(capsys, "splits", str(USER_ACTIVITY), "fixture-source", "--source",
                  "kafka") == (
        f"{SAVEPOINT}: fixture-source/SourceReaderState (subtask 0, element 0) at byte 0: kafka "
        "split serializer version 1 (supported: (0,))")
    assert main(["splits", str(USER_ACTIVITY), "fixture-source", "--json"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        '{"subtask": 0, "index": 0, "source": "fixture", "serializer_version": 1, '
        '"split_id": "split-0", "next": 100}')


def test_diff_without_differences_prints_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(USER_ACTIVITY), str(CATALOG / "user_activity_rocksdb")]) == 0
    assert capsys.readouterr().out == "0 differences\n"


def test_stats_of_a_state_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    # was an empty table and exit 0
    err = _error(capsys, "stats", str(USER_ACTIVITY), "--state", "profil")
    assert err.startswith(f"no state 'profil' in {SAVEPOINT} (states: fixture_source__")
    assert "user_state__profile" in err
    assert main(["stats", str(USER_ACTIVITY), "--state", "profile", "--json"]) == 0
    assert '"state": "profile"' in capsys.readouterr().out


def test_lookup_in_an_operator_without_keyed_state(capsys: pytest.CaptureFixture[str]) -> None:
    # was "no state holds key 'user-3' ()"
    assert _error(capsys, "lookup", str(USER_ACTIVITY), "user-3", "--operator",
                  "operator-state") == (
        f"operator 'operator-state' has no keyed state in {SAVEPOINT}: lookup reads keyed state "
        "(read shows operator state)")


def test_snapshot_out_into_a_missing_directory(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "missing" / "meta.msgpack"
    assert _error(capsys, "snapshot", str(USER_ACTIVITY), "--out", str(out)) == (
        f"--out {out}: the directory {out.parent} does not exist")
    assert not (tmp_path / "missing").exists()


def test_a_named_snapshot_that_is_missing_or_of_another_savepoint(tmp_path: Path) -> None:
    import statequery
    from statequery.exceptions import SnapshotIgnoredWarning

    missing = tmp_path / "typo.msgpack"
    with pytest.warns(SnapshotIgnoredWarning, match=f"no StateMeta snapshot at {missing}: "
                      "reading the state-file headers instead"):
        assert not statequery.open(str(USER_ACTIVITY), snapshot=str(missing)).from_snapshot
    other = tmp_path / "word_counts.msgpack"
    assert main(["snapshot", str(CATALOG / "word_counts"), "--out", str(other)]) == 0
    with pytest.warns(SnapshotIgnoredWarning, match="written for another _metadata than "
                      f"{SAVEPOINT / '_metadata'}"):
        sp = statequery.open(str(USER_ACTIVITY), snapshot=str(other))
    assert not sp.from_snapshot and sp.state_meta().num_rows == 15


@pytest.mark.parametrize(("argv", "message"), [
    (["export", str(USER_ACTIVITY), "user-state", "--out", "x", "--format", "parqet"],
     "argument --format: invalid choice: 'parqet' (choose from 'parquet', 'arrow', 'csv'); "
     "did you mean 'parquet'? (see 'statequery export --help')"),
    (["lokup", str(USER_ACTIVITY), "user-3"],
     "argument command: invalid choice: 'lokup' (choose from 'inspect', 'snapshot', 'read', "
     "'lookup', 'spark-views', 'sql', 'diff', 'stats', 'splits', 'export', 'versions', "
     "'changes', 'history', 'attach', 'detach', 'shell', 'serve', 'capture'); did you mean "
     "'lookup'? (see 'statequery --help')"),
    (["read", str(USER_ACTIVITY), "user_state__count", "--limit", "ten"],
     "argument --limit: invalid int value: 'ten' (see 'statequery read --help')"),
    (["export", str(USER_ACTIVITY)],
     "the following arguments are required: operator, --out (see 'statequery export --help')"),
])
def test_command_line_errors_are_one_line(argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err == f"statequery: {message}\n"


def test_no_command_prints_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: statequery") and "lookup" in out and "everything" in out


def test_a_catalog_database_still_being_written(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "done").symlink_to(USER_ACTIVITY)
    pending = tmp_path / "jobs" / "savepoint-3305c6-0123456789ab"
    pending.mkdir(parents=True)
    (pending / "7a81ce41-45d8-4fe5-a8b3-9e7d3bf9e84d").write_bytes(b"\0" * 16)
    assert _error(capsys, "sql", "SELECT * FROM jobs.state_meta", "--catalog",
                  str(tmp_path)) == (
        f"database 'jobs' of catalog {tmp_path}: no savepoint or checkpoint at "
        f"{tmp_path / 'jobs'}: savepoint-3305c6-0123456789ab holds no _metadata file: Flink "
        "writes it last, so that savepoint is still being written, or was never completed")
    # the other databases are there
    assert main(["sql", "SELECT count(*) AS n FROM done.state_meta", "--catalog", str(tmp_path),
                 "--json"]) == 0
    assert capsys.readouterr().out == '{"n": 15}\n'


def test_an_incremental_checkpoint_copied_without_shared(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = next((ROOT / "tests" / "fixtures" / "datastream-rocksdb-incremental-checkpoint")
               .iterdir())
    shutil.copytree(job / "chk-1", tmp_path / "chk-1")  # without ../shared
    err = _error(capsys, "lookup", str(tmp_path), "user-3")
    assert err.startswith("state file ") and "/shared/" in err.split(" not found")[0]
    assert f"also looked at {tmp_path / 'shared'}/" in err
    assert err.endswith("; an incremental checkpoint's files are in the job directory's shared/ "
                        "folder, beside chk-N: copy or point at the whole job directory")
    shutil.copytree(job / "shared", tmp_path / "shared")
    assert main(["lookup", str(tmp_path), "user-3", "--operator", "user-state", "--json"]) == 0
    assert '"state": "count", "key_group": 40, "key": "user-3", "namespace": null, "value": 10' \
        in capsys.readouterr().out


def test_export_into_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "user_state__count.parquet"
    out.write_bytes(b"x")
    assert _error(capsys, "export", str(USER_ACTIVITY), "user-state", "--out", str(out)) == (
        f"--out {out}: is a file; export writes one file per state into a directory")
    assert out.read_bytes() == b"x"
