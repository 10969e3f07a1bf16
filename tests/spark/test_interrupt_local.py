"""Ctrl-C during ``statequery sql --spark`` without a server (a local Spark of its own, the one
Spark this module starts): Spark's jobs are cancelled and the command ends with ``statequery:
interrupted: ...`` and exit 130 (it was ``statequery: An error occurred while calling
o199.getResult.``, exit 1, from the Py4J call that waited for the cancelled job)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_ctrl_c_of_a_local_sql_spark_is_an_interrupt_exit_130(tmp_path: Path) -> None:
    env = dict(os.environ, STATEQUERY_SPARK_DIR=str(tmp_path / "spark"),
               STATEQUERY_SPARK_PATH="python", PYTHONPATH=str(REPO),
               PYSPARK_PYTHON=sys.executable)
    proc = subprocess.Popen(
        [sys.executable, "-m", "statequery.cli", "sql", "--spark", "--master", "local[1]",
         "--catalog", str(REPO / "catalog" / "word_counts"),
         "SELECT sum(id % 7) FROM range(0, 1000000000000)"],
        env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    said = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            said.append(line)
            if line.startswith("statequery: databases of "):
                break  # attached: the query runs next (a Ctrl-C before it counts the same)
        else:
            pytest.fail("".join(said)[-3000:])
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = [ln for ln in err.splitlines() if ln.startswith("statequery: ")]
    assert proc.returncode == 130, err[-3000:]
    assert lines and lines[-1].startswith("statequery: interrupted"), err[-3000:]
    assert "Traceback" not in err and "unexpected error" not in err and out == ""
