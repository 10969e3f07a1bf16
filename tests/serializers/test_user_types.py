"""The job's own types travel as one typed value (:class:`UserTypes`), never as marks inside
the classpath: every ``--classpath`` entry is a path, whatever its name reads."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, fixture_dir

import statequery
from statequery.arrow.kryo import UserTypes
from statequery.cli import main
from statequery.exceptions import InvalidOptionError

NAME = "types-kryo-hashmap-canonical"


def test_a_classpath_entry_named_like_an_option_is_a_jar(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(FIXTURES / NAME / "job.jar", tmp_path / "protobuf-descriptors=x.pb")
    monkeypatch.chdir(tmp_path)
    assert main(["read", str(fixture_dir(NAME)), "--operator", "kryo-types", "--state",
                 "order", "--key", "k2", "--json",
                 "--classpath", "protobuf-descriptors=x.pb"]) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert row["value"]["customer"] == "plain ascii" and row["value_reason"] is None
    # a path too (missing here), not a Protobuf message pair
    with pytest.raises(InvalidOptionError, match="protobuf-message=a=b' does not exist"):
        statequery.open(str(fixture_dir(NAME)), classpath="protobuf-message=a=b")


def test_user_types_are_hashable_picklable_and_typed() -> None:
    with statequery.open(str(fixture_dir(NAME)), use_snapshot=False,
                         classpath=[FIXTURES / NAME / "job.jar"]) as sp:
        types = sp.context.classpath
    assert isinstance(types, UserTypes) and types
    assert types.jars == (str(FIXTURES / NAME / "job.jar"),)
    assert not types.kryo_2_24 and types.protobuf_descriptors is None
    assert pickle.loads(pickle.dumps(types)) == types and hash(types) == hash(
        UserTypes(types.jars))
    assert not UserTypes()
