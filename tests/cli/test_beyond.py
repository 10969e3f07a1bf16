"""``statequery diff`` (and the commands beyond reading): output, filters, errors, no progress
bar when piped."""

from __future__ import annotations

import json

import pytest
from support.series import series_dir

from statequery.cli import main


def test_diff_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    old, new = str(series_dir("chk-1")), str(series_dir("chk-2"))
    assert main(["diff", old, new, "--state", "count", "--json"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert sorted((r["key"], r["change"], r["old_value"], r["new_value"]) for r in rows) == sorted(
        [(f'"user-{u}"', "changed", "10", "20") for u in range(3, 10)]
        + [(f'"user-{u}"', "added", None, "10") for u in range(10, 13)]
    )
    assert captured.err == ""  # stderr is not a terminal: no progress bar


def test_diff_table_and_summary(capsys: pytest.CaptureFixture[str]) -> None:
    old, new = str(series_dir("chk-1")), str(series_dir("chk-2"))
    assert main(["diff", old, new, "--operator", "sequence-state", "--key", "user-5"]) == 0
    out = capsys.readouterr().out
    assert '"user-5"' in out and "buckets" in out
    # count, recent, buckets b1 and b2 changed; flag, buckets b0 and the cycle-0 timer removed;
    # the cycle-1 timer added
    assert out.rstrip().splitlines()[-1] == "8 differences: 1 added, 4 changed, 3 removed"


def test_diff_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    old = str(series_dir("chk-1"))
    assert main(["diff", old, str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("statequery: no savepoint or checkpoint at") and "Traceback" not in err
    assert main(["diff", old, old, "--state", "nope"]) == 1
    assert "no state 'nope'" in capsys.readouterr().err


def test_stats_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(series_dir("savepoint"))
    assert main(["stats", path, "--state", "count", "--parallelism", "4", "--json",
                 "--key-groups"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    (skew,) = doc["skew"]
    # the savepoint holds records 0..399: keys user-0 .. user-18, one count each
    assert skew["state"] == "count" and skew["entries"] == 19 == skew["distinct_keys"]
    assert len(skew["per_subtask_at"]) == 4 and sum(skew["per_subtask_at"]) == skew["bytes"]
    assert sum(r["entries"] for r in doc["key_groups"]) == 19
    assert captured.err == ""


def test_stats_table_and_splits(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(series_dir("chk-2"))
    assert main(["stats", path]) == 0
    out = capsys.readouterr().out
    assert "heaviest keys" in out and "SourceReaderState" in out
    assert main(["splits", path, "sequence-source", "--json"]) == 0
    (split,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (split["source"], split["from"], split["to"]) == ("number_sequence", 200, 999)
    assert main(["splits", path, "sequence-state"]) == 1
    assert "not a FLIP-27 source" in capsys.readouterr().err


def test_progress_bar_only_on_terminals() -> None:
    import io

    from statequery.cli.progress import progress_bar

    quiet = io.StringIO()
    with progress_bar("diff", 10, stream=quiet) as advance:
        advance(10)
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    with progress_bar("diff", 10, stream=shown, force=True) as advance:
        advance(5)
        advance(5)
    assert "diff" in shown.getvalue()
